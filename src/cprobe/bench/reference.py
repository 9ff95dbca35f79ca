"""Plain re-statements of the authors' eraser algorithms, for same-process comparisons.

Written from the published descriptions and reference repositories (INLP: Ravfogel et al. 2020's
nullspace-projection loop with a scikit-learn linear classifier; R-LACE: the rlace-icml minimax loop), not
copied from them. They are deliberately straightforward — numpy/scikit-learn, one step at a time — so that
cprobe's fast implementations can be checked against them and timed beside them
(``scripts/bench_interventions.py``, ``tests/unit/test_reference_erasers.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.metrics import log_loss


def reference_inlp(X: np.ndarray, z: np.ndarray, n_directions: int, C: float = 1.0, max_iter: int = 100,
                   tol: float = 1e-4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """INLP with scikit-learn's ``LogisticRegression`` as the classifier (defaults: C = 1, lbfgs, 100 iterations;
    on language-model states those 100 iterations stop short of the optimum — raise ``max_iter`` to converge).

    Each iteration fits on the data projected onto the nullspace of all earlier classifiers, collects the
    weight rows and rebuilds the projection onto the orthogonal complement of their span (via SVD).
    Returns (P (d, d), W (n_directions, d) the raw classifier rows in fitting order).
    """
    d = X.shape[1]
    rows: list[np.ndarray] = []
    P = np.eye(d)
    for _ in range(n_directions):
        clf = LogisticRegression(C=C, max_iter=max_iter, tol=tol, random_state=seed).fit(X @ P, z)
        rows.extend(clf.coef_)
        basis = np.linalg.svd(np.stack(rows), full_matrices=False)[2]
        P = np.eye(d) - basis.T @ basis
    return P, np.stack(rows)


def _fantope_eigenvalues(lam: np.ndarray, rank: int, iters: int = 25) -> np.ndarray:
    """Shift-and-clip eigenvalues onto {0 ≤ μ ≤ 1, Σμ = rank} by bisection on the shift."""
    def excess(theta: float) -> float:
        return float(np.clip(lam - theta, 0, 1).sum() - rank)

    hi, lo = float(lam.max()), float(lam.min()) - 1
    mid = (hi + lo) / 2
    for _ in range(iters):
        mid = (hi + lo) / 2
        if excess(mid) * excess(hi) > 0:
            hi = mid
        else:
            lo = mid
    return np.clip(lam - mid, 0, 1)


def _rounded(P: np.ndarray, rank: int) -> np.ndarray:
    """I − WᵀW with W the top-``rank`` eigenvectors of the relaxed P."""
    _, U = np.linalg.eigh(P)
    W = U[:, -rank:].T
    return np.eye(P.shape[0]) - W.T @ W


def _fresh_probe(X: np.ndarray, z: np.ndarray, P: np.ndarray, n_clfs: int, seed: int) -> tuple[float, float]:
    """Best (lowest log-loss) of ``n_clfs`` SGD logistic regressions on X P: (loss, accuracy) on X itself."""
    best = (np.inf, 0.0)
    for k in range(n_clfs):
        clf = SGDClassifier(loss="log_loss", alpha=1e-4, tol=1e-4, n_iter_no_change=15, max_iter=25_000,
                            random_state=seed + k).fit(X @ P, z)
        loss = log_loss(z, clf.predict_proba(X @ P))
        if loss < best[0]:
            best = (loss, float(clf.score(X @ P, z)))
    return best


def reference_rlace(X: np.ndarray, z: np.ndarray, rank: int = 1, max_steps: int = 75_000, batch_size: int = 128,
                    lr: float = 0.005, weight_decay: float = 1e-4, epsilon: float = 0.0015, eval_every: int = 1000,
                    n_eval_clfs: int = 3, seed: int = 0) -> dict:
    """The rlace-icml game: alternating single-batch SGD steps on a relaxed P (projected onto the Fantope by an
    eigendecomposition each step) and a linear predictor on X(I − P); every ``eval_every`` steps the rounded
    projection is scored by fresh SGD logistic regressions on the training data. The kept P is the one with
    the highest fresh-probe loss; training stops once the best fresh accuracy is within ``epsilon`` of the
    majority rate. Returns {"P": rounded projection, "steps": steps run, "accuracy": best fresh accuracy}.
    """
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    n, d = X.shape
    Xt, k = torch.tensor(X, dtype=torch.float32), len(np.unique(z))
    binary = k == 2
    zt = torch.tensor(z, dtype=torch.float32 if binary else torch.long)
    predictor = torch.nn.Linear(d, 1 if binary else k)
    loss_fn = torch.nn.BCEWithLogitsLoss() if binary else torch.nn.CrossEntropyLoss()
    P = (0.1 * torch.randn(d, d)).requires_grad_(True)
    opt_p = torch.optim.SGD([P], lr=lr, weight_decay=weight_decay)
    opt_c = torch.optim.SGD(predictor.parameters(), lr=lr, weight_decay=weight_decay)
    eye = torch.eye(d)
    majority = np.bincount(z).max() / n
    best_P, best_loss, best_acc = None, -1.0, 1.0
    step = 0
    for step in range(max_steps):
        with torch.no_grad():
            P.data = (P.data + P.data.T) / 2
        idx = torch.from_numpy(rng.permutation(n)[:batch_size])
        opt_p.zero_grad()
        (-loss_fn(predictor(Xt[idx] @ (eye - P)).squeeze(-1), zt[idx])).backward()
        opt_p.step()
        with torch.no_grad():
            lam, U = torch.linalg.eigh((P + P.T) / 2)
            mu = torch.from_numpy(_fantope_eigenvalues(lam.double().numpy(), rank)).float()
            P.data = (U * mu) @ U.T
        idx = torch.from_numpy(rng.permutation(n)[:batch_size])
        opt_c.zero_grad()
        loss_fn(predictor(Xt[idx] @ (eye - P.detach())).squeeze(-1), zt[idx]).backward()
        opt_c.step()
        if step % eval_every == 0:
            loss, acc = _fresh_probe(X, z, _rounded(P.detach().double().numpy(), rank), n_eval_clfs, seed)
            if loss > best_loss:
                best_P, best_loss = P.detach().double().numpy().copy(), loss
            best_acc = acc if abs(acc - majority) < abs(best_acc - majority) else best_acc
        if step > 1 and abs(best_acc - majority) < epsilon:
            break
    return {"P": _rounded(best_P, rank), "steps": step + 1, "accuracy": best_acc}
