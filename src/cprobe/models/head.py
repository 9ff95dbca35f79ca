"""The LM head at a few tokens: the logits of some token ids from those rows of the head only.

A language model's logits are ``post(x Wᵀ + b)``: ``x`` the state the vocabulary projection reads, ``W`` (V, d) and
``b`` (V,) (if any) the projection's weight and bias (``get_output_embeddings()``: a decoder's ``lm_head``, BERT's
``cls.predictions.decoder``, RoBERTa's ``lm_head.decoder``, DistilBERT's ``vocab_projector``), and ``post`` what the
model does to the logits after it — Gemma 2 and 3's soft cap ``cap · tanh(logits / cap)`` (``final_logit_softcapping``
in the config; read from the key the family names, :attr:`cprobe.models.family.Family.logit_softcap`), nothing in the
other listed families. Everything before the projection is left to the model itself: the final norm (in the base
model) and a masked LM's transform (BERT's dense + activation + LayerNorm, inside its head module) run as in any
forward, and :meth:`Head.capture` takes ``x`` where the projection would read it and ends the forward there.

A readout that compares k tokens (:meth:`cprobe.models.readouts.Readout.token_ids`) then needs k rows of ``W``:
:meth:`Head.rows` computes ``post(x · W[ids]ᵀ + b[ids])``, n·k·d multiply-adds instead of n·V·d (Gemma 3: V = 262,144,
d = 640, more parameters than its blocks). The numbers are the full head's at those columns, up to the float rounding
of a different matrix product (tested per family in ``tests/unit/test_head.py``).

A readout that needs the normaliser at a few tokens — DAS's loss, the log-probability of the source label over the
whole vocabulary (CausalGym eq. 12) — still reads every row of ``W``, but once: :meth:`Head.log_probs` streams ``W`` in
chunks of rows and keeps, per input row, the running maximum, the running sum of ``exp`` and the gradient's numerator
``Σ_v e^{z_v} post'(u_v) w_v`` (the online log-sum-exp, rescaled when the maximum moves), so the value and its gradient
come from one read of each chunk while it is in cache, and no (n, V) logits, log-softmax or their gradients are
materialised (chunks of :data:`CPU_CHUNK` rows on a CPU, :data:`DEVICE_CHUNK` on an accelerator). The numbers are the
full log-softmax's up to float rounding (``tests/unit/test_head.py``).

A family whose head cannot be split so (an unknown, derived family: its logits might be scaled or capped in ways
cprobe does not know) declares ``split_head = False`` and every readout there runs the full head.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cprobe.compute import fit_threads
from cprobe.models.family import family_of
from cprobe.models.resume import StopForward

CPU_CHUNK = 1024
"""Vocabulary rows per step of :meth:`Head.log_normaliser` on a CPU: a chunk (1,024 × d floats: 2.6 MB at Gemma 3's
d = 640) stays in cache between its two products (``python scripts/bench_head.py --das-steps N`` measures the loss)."""

DEVICE_CHUNK = 32768
"""The same on an accelerator: few enough chunks that kernel launches do not count (8 for Gemma 3's 262,144 rows),
small enough that the chunk's few (n, chunk) temporaries stay well under the (n, V) logits of the plain path."""


class Capture:
    """A forward pre-hook on the vocabulary projection that keeps its input (``x``) and ends the forward
    (:class:`~cprobe.models.resume.StopForward`), so the projection over the whole vocabulary never runs."""

    def __init__(self, module: nn.Module) -> None:
        self.x: Tensor | None = None
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _m: nn.Module, args: tuple, kwargs: dict) -> None:
        self.x = args[0] if args else next(iter(kwargs.values()))
        raise StopForward

    def remove(self) -> None:
        self.handle.remove()


class Head:
    """The split LM head of one model (module doc): its projection and its soft cap."""

    def __init__(self, projection: nn.Linear, softcap: float | None) -> None:
        self.projection = projection
        self.softcap = softcap

    @classmethod
    def of(cls, model: nn.Module) -> Head | None:
        """The model's split head, or None when its family does not declare one (``split_head``), the model has no
        linear vocabulary projection (``get_output_embeddings()``), or the projection's weights are offloaded (a device
        map's disk or CPU offload keeps them on the meta device and loads them inside the module's own forward)."""
        family = family_of(model.config)
        get = getattr(model, "get_output_embeddings", None)
        projection = get() if family.split_head and callable(get) else None
        if not isinstance(projection, nn.Linear) or projection.weight.is_meta:
            return None
        cap = getattr(model.config, family.logit_softcap, None) if family.logit_softcap else None
        return cls(projection, float(cap) if cap else None)

    def capture(self) -> Capture:
        """Keep the projection's input of the next forward and end the forward there (remove it after)."""
        return Capture(self.projection)

    def post(self, logits: Tensor) -> Tensor:
        """What the model does to the projection's output: the soft cap (in HF's order of operations), or nothing."""
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def rows(self, x: Tensor, ids: Tensor) -> Tensor:
        """Logits (n, k) of tokens ``ids`` (n, k) from the projection's inputs ``x`` (n, d): those rows of ``W`` (and
        ``b``) only, then :meth:`post`; in the head's dtype, on its device."""
        w = self.projection.weight
        ids = ids.to(w.device)
        logits = torch.bmm(w[ids], x.to(w.device, w.dtype)[:, :, None])[:, :, 0]
        if self.projection.bias is not None:
            logits = logits + self.projection.bias[ids]
        return self.post(logits)

    def log_normaliser(self, x: Tensor) -> Tensor:
        """log Σ_v exp post(x · w_v + b_v) over the whole vocabulary (n,), float32, from the projection's inputs ``x``
        (n, d): streamed over chunks of the head's rows (module doc), differentiable in ``x`` once (a second
        derivative raises; ``adapter.head_rows = False`` takes the plain path). A projection that is itself being
        trained (its weight requiring a gradient) takes the plain full product instead, so its gradient is not lost."""
        w, b = self.projection.weight, self.projection.bias
        x = x.to(w.device, w.dtype)
        trained = w.requires_grad or (b is not None and b.requires_grad)
        if trained and torch.is_grad_enabled():
            return torch.logsumexp(self.post(nn.functional.linear(x, w, b)).float(), -1)
        chunk = CPU_CHUNK if w.device.type == "cpu" else DEVICE_CHUNK
        # a chunk's ops are small (2·n·chunk·d flops): on a CPU they run on the threads the project's small-op rule
        # gives them (one below 10⁹ flops), so that a core another process takes cannot stall every chunk's barriers
        with fit_threads(2 * x.shape[0] * min(chunk, w.shape[0]) * x.shape[1], w.device):
            if not (torch.is_grad_enabled() and x.requires_grad):  # the value only: no gradient's numerator
                with torch.no_grad():
                    return _streamed(x, w, b, self.softcap, chunk, grad=False)[0]
            return _StreamedLogSumExp.apply(x, w, b, self.softcap, chunk)

    def log_probs(self, x: Tensor, ids: Tensor) -> Tensor:
        """Log-probabilities (n, k), float32, of tokens ``ids`` (n, k) over the whole vocabulary from the projection's
        inputs ``x`` (n, d): :meth:`rows` − :meth:`log_normaliser`, one streamed read of the head."""
        return self.rows(x, ids).float() - self.log_normaliser(x)[:, None]

    def input_of(self, head: nn.Module, h: Tensor) -> Tensor:
        """The projection's inputs (n, d) when ``head`` (the module holding the projection: a decoder's ``lm_head``
        itself, BERT's ``cls``) reads the states ``h`` (n, d): the part of the head before the projection, run."""
        grab = self.capture()
        try:
            head(h[:, None])
        except StopForward:
            pass
        finally:
            grab.remove()
        assert grab.x is not None, "the head module did not call its vocabulary projection"
        return grab.x[:, 0]


def _streamed(x: Tensor, weight: Tensor, bias: Tensor | None, softcap: float | None, chunk: int,
              grad: bool) -> tuple[Tensor, Tensor | None]:
    """(lse (n,), d lse / dx (n, d) or None) over row chunks of ``weight`` (:class:`_StreamedLogSumExp`)."""
    n, d = x.shape
    # the running maximum starts at the lowest finite float, not −inf, so that a chunk whose logits are all −inf (a
    # masked token's bias) adds exp(−inf) = 0 instead of NaN; a row with every logit −inf ends at −inf, as
    # torch.logsumexp does
    m = torch.full((n,), torch.finfo(torch.float32).min, device=x.device)
    s = torch.zeros(n, device=x.device)
    num = torch.zeros(n, d, device=x.device) if grad else None
    for c0 in range(0, weight.shape[0], chunk):
        w = weight[c0:c0 + chunk]
        z = (x @ w.T).float()
        if bias is not None:
            z += bias[c0:c0 + chunk].float()
        if softcap is not None:
            t = z.div_(softcap).tanh_()
            z = t * softcap
        top = torch.maximum(m, z.amax(1))
        scale = torch.exp(m - top)  # 0 on the first chunk
        e = z.sub_(top[:, None]).exp_()
        s = torch.addcmul(e.sum(1), s, scale)
        if num is not None:
            if softcap is not None:
                e *= 1 - t * t  # post'(u) = 1 − tanh²(u / cap)
            num.mul_(scale[:, None])
            if w.dtype == e.dtype:
                num.addmm_(e, w)
            else:  # a half-precision head: its product in its dtype, summed in float32
                num.add_((e.to(w.dtype) @ w).float())
        m = top
    return m + torch.log(s), (None if num is None else num / s[:, None])


class _StreamedLogSumExp(torch.autograd.Function):
    """lse(x) = log Σ_v exp z_v, z_v = post(u_v), u_v = x · w_v + b_v, over row chunks of W (n, d) → (n,).

    Per chunk: its logits, the new running maximum m', the sum rescaled by e^{m − m'} plus the chunk's Σ e^{z − m'},
    and, when ``x`` needs a gradient, the numerator rescaled alike plus the chunk's (e^{z − m'} · post'(u)) @ W_chunk.
    d lse / dx = Σ_v p_v post'(u_v) w_v = numerator / sum, kept from the forward; the backward only scales it. The
    head's weight and bias get no gradient (the caller checks they need none)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, softcap: float | None,  # type: ignore[override]
                chunk: int) -> Tensor:
        lse, dx = _streamed(x, weight, bias, softcap, chunk, grad=True)
        ctx.save_for_backward(dx)
        ctx.x_dtype = x.dtype
        return lse

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph: the kept gradient is a constant, its own derivative is not there
            raise RuntimeError("the streamed LM-head normaliser (cprobe.models.head) has no second derivative; set "
                               "adapter.head_rows = False to take the full head's log-softmax")
        (dx,) = ctx.saved_tensors
        return (grad[:, None] * dx).to(ctx.x_dtype), None, None, None, None
