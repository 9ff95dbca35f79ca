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

AxBench's rules (:data:`TEXT_RULES`, Wu et al. 2025; ``axbench/models/sae.py`` in stanfordnlp/axbench) score a
latent on **texts**, not rows: the fitting rows are the tokens of texts (``texts`` (n,) gives each row's text, every
token labelled by its text's class) and a text's latent value pools its tokens first (:func:`text_scores`):

- ``auroc`` (``GemmaScopeSAEMaxAUC``, the rule of AxBench's SAE-selection sweeps): a text's value is the **maximum**
  over its tokens; ``s_j`` is the AUROC of those values, texts with the concept against texts without
  (:func:`cprobe.metrics.detection.auroc_columns`: ties count one half);
- ``mean_diff`` (``GemmaScopeSAEMaxDiff``): a text's value is the **mean** over its tokens; ``s_j`` is the mean over
  the positive texts minus the mean over the negative ones, signed (a latent that fires less on the concept scores
  below zero).

AxBench keeps the one latent with the highest score (``topk(...)[0]``); :func:`top` does the same, ties to the lower
index.

:func:`l1_classifier` is RAVEL's rule (explanare/ravel ``select_features_with_classifier``): a set, not a ranking —
the latents whose weights in an L1-penalised linear SVM over the property's classes (scikit-learn's ``LinearSVC``,
``penalty="l1"``, squared hinge, primal, one-vs-rest, ``tol=0.01``, ``max_iter=5000``) are not all zero: the sum over
the classes of ``|w_c,j|`` above 1e-5 (``SelectFromModel``'s threshold for an L1-penalised model). A smaller ``C``
penalises more and keeps fewer latents.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cprobe.metrics.detection import auroc_columns
from cprobe.sae.dictionary import SAE
from cprobe.stats import class_means, fit_logistic

RULES = ("mean_diff", "probe", "attribution")
TEXT_RULES = ("auroc", "mean_diff")
"""AxBench's rules, scored on texts (:func:`text_scores`; module doc)."""
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



def pooled_latents(sae: SAE, X: Tensor, texts: Tensor, how: str, batch_size: int = 4096) -> Tensor:
    """(n_texts, d_sae) float64: each text's ``max`` or ``mean`` over its rows of the latents of ``X`` (n, d_in),
    encoded ``batch_size`` rows at a time (a released SAE's 16k latents over every token would not fit at once);
    ``texts`` (n,) holds each row's text id in [0, n_texts), every id with a row."""
    if how not in ("max", "mean"):
        raise ValueError(f"unknown pooling {how!r}; choose from ['max', 'mean']")
    texts = texts.cpu().long()
    n = int(texts.max()) + 1
    counts = torch.bincount(texts, minlength=n)
    if bool((counts == 0).any()):
        raise ValueError(f"text ids must run from 0 to {n - 1} with a row each; {int((counts == 0).sum())} have none")
    out = torch.full((n, sae.d_sae), -torch.inf if how == "max" else 0.0, dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, len(X), batch_size):
            F, t = sae.encode(X[i:i + batch_size].float()).double().cpu(), texts[i:i + batch_size]
            if how == "max":
                out = out.scatter_reduce(0, t[:, None].expand_as(F), F, "amax")
            else:
                out.index_add_(0, t, F)
    return out if how == "max" else out / counts[:, None]


def text_ids(y: Tensor, texts: Tensor | None) -> Tensor:
    """(n,) long: each fitting row's text id — ``texts`` as given (one per row of the labels ``y``), or each row a text
    of its own where none is given (a study that reads no texts); a ValueError when the counts differ."""
    if texts is None:
        return torch.arange(len(y))
    texts = texts.cpu().long()
    if texts.shape != y.shape:
        raise ValueError(f"expected one text id per row, got {tuple(texts.shape)} for {len(y)} rows")
    return texts


def text_labels(y: Tensor, texts: Tensor) -> Tensor:
    """(n_texts,) each text's class from its rows' labels ``y`` (n,); a ValueError when a text's rows disagree."""
    texts, y = texts.cpu().long(), y.cpu().long()
    n = int(texts.max()) + 1
    lab = torch.full((n,), -1, dtype=torch.long).scatter_(0, texts, y)
    if bool((lab[texts] != y).any()):
        raise ValueError("the rows of one text carry different labels: each token is labelled by its text's class")
    return lab


def text_scores(rule: str, sae: SAE, X: Tensor, y: Tensor, texts: Tensor) -> Tensor:
    """The score of every latent (d_sae,) float64 by AxBench's ``rule`` (:data:`TEXT_RULES`, module doc), from the
    states X (n, d_in) of the tokens of texts, their labels y (n,; 1 = the concept, 0 = not) and text ids (n,)."""
    if rule not in TEXT_RULES:
        raise ValueError(f"unknown AxBench latent selection rule {rule!r}; choose from {list(TEXT_RULES)}")
    lab = text_labels(y, texts)
    if set(torch.unique(lab).tolist()) != {0, 1}:
        raise ValueError(f"expected texts of classes {{0, 1}}, got {sorted(torch.unique(lab).tolist())}")
    if rule == "auroc":
        return auroc_columns(pooled_latents(sae, X, texts, "max"), lab)
    V = pooled_latents(sae, X, texts, "mean")
    return V[lab == 1].mean(0) - V[lab == 0].mean(0)


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
