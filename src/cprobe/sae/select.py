"""Which latents carry a property: a score per latent from labelled states, by one of three rules (:data:`RULES`).

With ``F`` the latents of the fitting states, ``z`` their class ids in [0, k), μ_c,j the mean of latent j over class
c and μ_¬c,j over the other classes:

- ``mean_diff``: ``s_j = max_c |μ_c,j − μ_¬c,j|`` (the difference of the two class means for a binary property;
  AxBench's DiffMean on latents).
- ``probe``: an L2 logistic probe (:func:`cprobe.stats.fit_logistic`, ``l2`` = :data:`PROBE_L2`) on the standardised
  latents that fire at least once; ``s_j = max_r |w_r,j|`` over the probe's rows (one for two classes, one per class
  otherwise). Latents that never fire score 0.
- ``attribution``: attribution patching (Syed et al. 2023; Marks et al. 2024's feature attribution) of a linear
  probe's logit on the states: moving latent j from the other classes' mean to class c's changes the logit by about
  ``(μ_c,j − μ_¬c,j) · (W_dec,j · ∇ₓ logit_c)``, with ``∇ₓ logit_c`` the probe's weight row (fitted on standardised
  states, so divided by their standard deviations); ``s_j`` is its largest absolute value over c.

:func:`top` takes the ``m`` best; ties go to the lower latent index.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cprobe.sae.dictionary import SAE
from cprobe.stats import class_means, fit_logistic

RULES = ("mean_diff", "probe", "attribution")
PROBE_L2 = 1e-2
"""The probes' L2 penalty (per-row mean-loss scale, on standardised inputs)."""


def one_vs_rest(F: Tensor, z: Tensor) -> Tensor:
    """``μ_c − μ_¬c`` per class (k, d) in float64."""
    Fd = F.double()
    k = int(z.max()) + 1
    means = class_means(Fd, z)
    counts = torch.bincount(z, minlength=k).double()[:, None]
    rest = (Fd.sum(0) - means * counts) / (len(z) - counts)
    return means - rest


def scores(rule: str, sae: SAE, X: Tensor, F: Tensor, z: Tensor) -> Tensor:
    """The score of every latent (d_sae,) float64 by ``rule`` (module doc), from states X (n, d_in), their latents F
    (n, d_sae) and class ids z (n,)."""
    if rule not in RULES:
        raise ValueError(f"unknown latent selection rule {rule!r}; choose from {list(RULES)}")
    k = int(z.max()) + 1
    diff = one_vs_rest(F, z)
    if rule == "mean_diff":
        return diff.abs().max(0).values
    if rule == "probe":
        out = torch.zeros(F.shape[1], dtype=torch.float64)
        live = (F != 0).any(0)
        Fl = F[:, live].double()
        W, _ = fit_logistic((Fl - Fl.mean(0)) / Fl.std(0).clamp_min(1e-12), z, k, PROBE_L2)
        out[live] = W.abs().max(0).values.cpu()
        return out
    Xd = X.double()
    std = Xd.std(0).clamp_min(1e-12)
    W, _ = fit_logistic((Xd - Xd.mean(0)) / std, z, k, PROBE_L2)
    grad = W / std  # (rows, d_in): ∇ₓ of each logit
    rows = diff[1:] if k == 2 else diff  # one logit for two classes: class 1's
    return (rows * (grad @ sae.W_dec.double().T)).abs().max(0).values


def top(score: Tensor, m: int) -> Tensor:
    """Indices (m,) of the ``m`` highest scores, highest first (stable: ties to the lower index)."""
    order = torch.sort(-score, stable=True).indices
    return order[:m]
