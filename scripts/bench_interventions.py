"""Wall-clock cost of cprobe's INLP and R-LACE against plain reference loops on the same data.

(a) INLP vs a plain scikit-learn loop (LogisticRegression + nullspace projection);
(b) R-LACE vs a plain SGD minimax loop (same game, fixed epochs, no early stop).
Prints time ratios (ours / plain) and held-out linear-probe accuracy after each eraser.

    python scripts/bench_interventions.py                       # synthetic, n=3000, d=768
    python scripts/bench_interventions.py --npz states.npz      # arrays X (n, d), z (n,)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from cprobe.interventions.inlp import INLP
from cprobe.interventions.rlace import RLACE, project_fantope, round_to_projection


def synthetic(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two Gaussian classes, shared decaying-spectrum covariance (BERT-like anisotropy)."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    delta = rng.standard_normal(d)
    delta *= 1.5 / np.linalg.norm(delta)
    X = rng.standard_normal((n, d)) * (2.0 / np.sqrt(np.arange(1, d + 1))) + np.outer(z, delta)
    return X.astype(np.float32), z.astype(np.int64)


def probe_accuracy(X: np.ndarray, z: np.ndarray, n_train: int) -> float:
    clf = LogisticRegression(max_iter=500).fit(X[:n_train], z[:n_train])
    return float(clf.score(X[n_train:], z[n_train:]))


def plain_inlp(X: np.ndarray, z: np.ndarray, rank: int) -> np.ndarray:
    """The textbook loop: fit, collect the normal, rebuild the nullspace projection."""
    d = X.shape[1]
    normals: list[np.ndarray] = []
    P = np.eye(d)
    for _ in range(rank):
        clf = LogisticRegression(max_iter=500).fit(X @ P, z)
        normals.append(clf.coef_[0])
        basis = np.linalg.svd(np.stack(normals), full_matrices=False)[2]
        P = np.eye(d) - basis.T @ basis
    return P


def plain_rlace(X: torch.Tensor, z: torch.Tensor, rank: int, epochs: int, batch_size: int, seed: int) -> torch.Tensor:
    """Alternating SGD on classifier and relaxed P with a Fantope projection each step."""
    torch.manual_seed(seed)
    n, d = X.shape
    clf = torch.nn.Linear(d, 2)
    P = project_fantope(torch.randn(d, d) * 1e-3, rank).requires_grad_(True)
    opt_c = torch.optim.SGD(clf.parameters(), lr=0.005, weight_decay=1e-5)
    opt_p = torch.optim.SGD([P], lr=0.005, weight_decay=1e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        for idx in torch.randperm(n).split(batch_size):
            xb, zb = X[idx], z[idx]
            opt_c.zero_grad()
            loss_fn(clf(xb - xb @ P.detach()), zb).backward()
            opt_c.step()
            opt_p.zero_grad()
            (-loss_fn(clf(xb - xb @ P), zb)).backward()
            opt_p.step()
            with torch.no_grad():
                P.copy_(project_fantope(P, rank))
    return round_to_projection(P.detach(), rank)


def timed(fn):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--npz", help="load arrays X (n, d) and z (n,) instead of synthetic data")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--inlp-rank", type=int, default=8)
    ap.add_argument("--rlace-rank", type=int, default=1)
    ap.add_argument("--rlace-epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.npz:
        data = np.load(args.npz)
        X, z = data["X"].astype(np.float32), data["z"].astype(np.int64)
    else:
        X, z = synthetic(args.n, args.d, args.seed)
    n_train = int(0.7 * len(X))
    Xt, zt = torch.from_numpy(X), torch.from_numpy(z)
    Xtr, ztr = Xt[:n_train], zt[:n_train]
    print(f"data: n={len(X)} d={X.shape[1]} majority={np.bincount(z).max() / len(z):.3f}")
    print(f"probe accuracy before erasure: {probe_accuracy(X, z, n_train):.3f}")

    ours, t_ours = timed(lambda: INLP(args.inlp_rank).fit(Xtr, ztr))
    P_plain, t_plain = timed(lambda: plain_inlp(X[:n_train], z[:n_train], args.inlp_rank))
    acc_ours = probe_accuracy(ours.transform(Xt).numpy(), z, n_train)
    acc_plain = probe_accuracy(X @ P_plain.astype(np.float32), z, n_train)
    print(
        f"INLP  r={args.inlp_rank}: ours {t_ours:.2f}s  sklearn {t_plain:.2f}s  ratio {t_ours / t_plain:.2f}  "
        f"acc after: ours {acc_ours:.3f} sklearn {acc_plain:.3f}"
    )

    rl = RLACE(args.rlace_rank, epochs=args.rlace_epochs, batch_size=args.batch_size, seed=args.seed)
    rl, t_rl = timed(lambda: rl.fit(Xtr, ztr))
    P_rl, t_rl_plain = timed(
        lambda: plain_rlace(Xtr, ztr, args.rlace_rank, args.rlace_epochs, args.batch_size, args.seed)
    )
    acc_rl = probe_accuracy(rl.transform(Xt).numpy(), z, n_train)
    acc_rl_plain = probe_accuracy((Xt @ P_rl).numpy(), z, n_train)
    print(
        f"RLACE r={args.rlace_rank}: ours {t_rl:.2f}s ({rl.epochs_run} epochs)  plain {t_rl_plain:.2f}s "
        f"({args.rlace_epochs} epochs)  ratio {t_rl / t_rl_plain:.2f}  "
        f"acc after: ours {acc_rl:.3f} plain {acc_rl_plain:.3f}"
    )


if __name__ == "__main__":
    main()
