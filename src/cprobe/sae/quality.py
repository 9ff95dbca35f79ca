"""How good an SAE is on a set of states: reconstruction FVU, mean L0, the fraction of dead latents.

- **FVU** (fraction of variance unexplained): ``Σ‖x − x̂‖² / Σ‖x − x̄‖²`` over the rows, x̄ the rows' mean state; 0 is a
  perfect reconstruction, 1 is no better than predicting x̄.
- **L0**: the mean over rows of the number of nonzero latents.
- **dead fraction**: the share of latents that are zero on every row.

:class:`Quality` accumulates them over minibatches (float64 sums), so a stream of shards is measured in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
