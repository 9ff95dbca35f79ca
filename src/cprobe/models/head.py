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

A family whose head cannot be split so (an unknown, derived family: its logits might be scaled or capped in ways
cprobe does not know) declares ``split_head = False`` and every readout there runs the full head.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cprobe.models.family import family_of
from cprobe.models.resume import StopForward


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

