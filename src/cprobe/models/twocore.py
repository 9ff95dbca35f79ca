"""Train a small model on two cores with the bits of one: the backward of every ``nn.Linear`` computes its input
gradient and its weight (and bias) gradient at the same time, on two threads, each one single-threaded GEMM.

Tiny-model training runs on one intra-op thread (``models.portable.TRAIN_THREADS``): a fixed reduction order gives the
same weights whatever the machine's core count (and on every x86-64 CPU with AVX2 where the CPU paths are pinned too:
the portable process, ``models/portable.py``). A second intra-op thread would change that order; this does not. The two
gradients are the exact calls autograd's ``AddmmBackward0`` makes for ``F.linear`` on a contiguous input (``grad @ W``
and ``grad.T @ x``, and the bias reduced as ``sum_to`` does), only started together, so the trained weights are bitwise
those of the plain backward (``tests/unit/test_twocore.py``); half of the backward's matrix products leave the critical
path (~20% of a tiny BERT's training step on 2 idle cores). On one CPU it changes nothing.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from torch import Tensor, nn

_POOL: ThreadPoolExecutor | None = None


def _weight_grads(g: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    with torch.no_grad():  # a new thread records graphs by default
        return g.t().mm(x), g.sum(0, keepdim=True).view(g.shape[1])


class _Addmm(torch.autograd.Function):
    """``addmm(bias, x, W.T)`` whose backward starts the weight gradient on the second thread."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return torch.addmm(bias, x, weight.t())

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        assert _POOL is not None
        weights = _POOL.submit(_weight_grads, g, x)
        gx = g.mm(weight) if ctx.needs_input_grad[0] else None
        gw, gb = weights.result()
        return gx, gw, gb


def _forward(self: nn.Linear, x: Tensor) -> Tensor:
    """``F.linear`` as ATen computes it (a contiguous input flattened to 2-D, ``addmm``), through :class:`_Addmm`;
    any other case (no bias, a strided input) is plain ``F.linear``."""
    if self.bias is None or not x.is_contiguous() or x.dim() < 2 or not torch.is_grad_enabled():
        return nn.functional.linear(x, self.weight, self.bias)
    if x.dim() == 2:
        return _Addmm.apply(x, self.weight, self.bias)
    out = _Addmm.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
    return out.view(*x.shape[:-1], out.shape[-1])


@contextmanager
def two_core_backward(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, ``model``'s ``nn.Linear`` layers run their backward on two threads (see the module doc);
    their forward is restored afterwards. ``enabled=False`` (e.g. one usable CPU) changes nothing."""
    global _POOL
    linears = [m for m in model.modules() if type(m) is nn.Linear] if enabled else []
    if linears and _POOL is None:
        _POOL = ThreadPoolExecutor(1, thread_name_prefix="cprobe-grad")
    for m in linears:
        m.forward = types.MethodType(_forward, m)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in linears:
            del m.forward
