"""How good an SAE is on a set of states: reconstruction FVU, mean L0, the fraction of dead latents.

- **FVU** (fraction of variance unexplained): ``Σ‖x − x̂‖² / Σ‖x − x̄‖²`` over the rows, x̄ the rows' mean state; 0 is a
  perfect reconstruction, 1 is no better than predicting x̄.
- **L0**: the mean over rows of the number of nonzero latents.
- **dead fraction**: the share of latents that are zero on every row.

:class:`Quality` accumulates them over minibatches (float64 sums), so a stream of shards is measured in one pass.
:func:`held_out` is what every study writes on the rows of an SAE method: the quality on states the SAE was neither
trained nor fitted on (its evaluation split at the same site), so a dictionary that only memorised its few hundred
training states shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cprobe.sae.dictionary import SAE


@dataclass
class Quality:
    """Streaming sums for :meth:`report` (module doc); :meth:`update` one minibatch of states at a time."""

    d_sae: int
    n: int = 0
    sse: float = 0.0
    nonzero: int = 0
    sum_x: Tensor | None = None
    sum_x2: float = 0.0
    fired: Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.fired = torch.zeros(self.d_sae, dtype=torch.bool)

    def update(self, x: Tensor, x_hat: Tensor, f: Tensor) -> None:
        xd = x.double()
        self.n += len(x)
        self.sse += float(((xd - x_hat.double()) ** 2).sum())
        self.sum_x = xd.sum(0).cpu() if self.sum_x is None else self.sum_x + xd.sum(0).cpu()
        self.sum_x2 += float((xd ** 2).sum())
        nz = f != 0
        self.nonzero += int(nz.sum())
        self.fired |= nz.any(0).cpu()

    def report(self) -> dict[str, float]:
        """``{"fvu", "l0", "dead_fraction", "n"}``; FVU is NaN when the states do not vary."""
        if self.n == 0 or self.sum_x is None:
            raise ValueError("no rows measured")
        total = self.sum_x2 - float((self.sum_x ** 2).sum()) / self.n  # Σ‖x − x̄‖²
        return {"fvu": self.sse / total if total > 0 else float("nan"), "l0": self.nonzero / self.n,
                "dead_fraction": 1.0 - float(self.fired.double().mean()), "n": float(self.n)}


def measure(sae: SAE, X: Tensor, batch_size: int = 4096) -> dict[str, float]:
    """:meth:`Quality.report` of ``sae`` on the states ``X`` (n, d_in), in minibatches."""
    q = Quality(sae.d_sae)
    with torch.no_grad():
        for i in range(0, len(X), batch_size):
            x = X[i:i + batch_size].float()
            f = sae.encode(x)
            q.update(x, sae.decode(f), f)
    return q.report()


HELD_OUT = ("sae_fvu", "sae_l0", "sae_dead_fraction")
"""The columns (and record metrics) of an SAE's quality on held-out states (:func:`held_out`)."""


def sae_of(fitted: Any) -> SAE | None:
    """The SAE a fitted method runs on: its own (``sae_``: the SAE methods), or that of the first direction method a
    bridged intervention fitted (``directions_``: ``sae_decoder_direction``); None for a method without one."""
    for src in (fitted, *list(getattr(fitted, "directions_", ()) or ())[:1]):
        sae = getattr(src, "sae_", None)  # unfitted: NotFittedError is an AttributeError, so None
        if isinstance(sae, SAE):
            return sae
    return None


def held_out(fitted: Any, X: Tensor) -> dict[str, float]:
    """The quality of a fitted method's SAE (:func:`sae_of`) on held-out states ``X`` (n, d_in) — states it was not
    trained or fitted on (the study's evaluation split at the same site) — as ``{sae_fvu, sae_l0, sae_dead_fraction,
    sae_n}``: the columns every study writes on the rows of an SAE method (:data:`HELD_OUT`, ``sae_n`` the states
    measured); ``{}`` for a method without an SAE or without held-out states."""
    sae = sae_of(fitted)
    if sae is None or len(X) == 0:
        return {}
    q = measure(sae, X.detach().to("cpu", torch.float32))
    return {"sae_fvu": q["fvu"], "sae_l0": q["l0"], "sae_dead_fraction": q["dead_fraction"], "sae_n": int(q["n"])}
