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

:func:`l1_classifier` is RAVEL's rule (explanare/ravel ``select_features_with_classifier``): a set, not a ranking —
the latents whose weights in an L1-penalised linear SVM over the property's classes (scikit-learn's ``LinearSVC``,
``penalty="l1"``, squared hinge, primal, one-vs-rest, ``tol=0.01``, ``max_iter=5000``) are not all zero: the sum over
the classes of ``|w_c,j|`` above 1e-5 (``SelectFromModel``'s threshold for an L1-penalised model). A smaller ``C``
penalises more and keeps fewer latents.
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


L1_THRESHOLD = 1e-5
"""scikit-learn's ``SelectFromModel`` threshold for an estimator with an L1 penalty."""


def l1_classifier(F: Tensor, z: Tensor, C: float, seed: int = 0) -> Tensor:
    """RAVEL's selection (module doc): the latent indices (ascending) an L1-penalised linear SVM on the latents ``F``
    (n, d_sae) with classes ``z`` (n,) gives a nonzero weight."""
    import warnings

    import numpy as np
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC

    X = F.detach().cpu().double().numpy()
    y = z.detach().cpu().long().numpy()
    if len(np.unique(y)) < 2:
        raise ValueError("the L1 classifier needs two classes or more among the states")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        svm = LinearSVC(C=C, penalty="l1", dual=False, max_iter=5000, tol=0.01, random_state=seed).fit(X, y)
    importance = np.abs(np.atleast_2d(svm.coef_)).sum(0)
    return torch.from_numpy(np.flatnonzero(importance > L1_THRESHOLD)).long()
