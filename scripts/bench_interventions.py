"""Erasers against the reference algorithms, in one process, on the same data: time and result side by side.

Data: the shared fixture (real all-MiniLM-L6-v2 last-layer [MASK] states on LGD, subject number, stratified
60/20/20; see ``cprobe.bench.fixtures``) — or ``--npz`` with arrays X_train, z_train, X_test, z_test.
Fits on train; "acc" is a fresh scikit-learn ``LogisticRegression(max_iter=1000)`` trained on the erased
train states and scored on the erased test states (majority printed for reference).

- INLP (8 and 32 directions) vs the nullspace-projection loop with scikit-learn ``LogisticRegression``
  (C = 1) — at scikit-learn's default 100 lbfgs iterations (not converged on these states) and converged
  (``max_iter`` 5000); "angle" is the largest principal angle between the removed subspaces.
- R-LACE (rank 1) vs the rlace-icml loop (``cprobe.bench.reference.reference_rlace``), same lr, weight
  decay (1e-5) and batch size; both stop at ε = 0.0015 from the majority rate.
- LEACE vs ``concept_erasure.LeaceEraser`` at its defaults; "max |Δ|" compares the erased test states.

Goals at equal result: INLP ≥ 10×, R-LACE ≥ 5×, LEACE ≥ 1× the reference's speed.

    OMP_NUM_THREADS=2 python scripts/bench_interventions.py [--only inlp,rlace,leace] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.linalg import subspace_angles
from sklearn.linear_model import LogisticRegression


def timed(fn):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def fresh_accuracy(data: dict, P: np.ndarray) -> float:
    clf = LogisticRegression(max_iter=1000).fit(data["X_train"] @ P, data["z_train"])
    return float(clf.score(data["X_test"] @ P, data["z_test"]))


def removed_angle(P_a: np.ndarray, P_b: np.ndarray, rank: int) -> float:
    """Largest principal angle (degrees) between the row spaces removed by two projections."""
    def removed(P: np.ndarray) -> np.ndarray:
        lam, V = np.linalg.eigh(np.eye(len(P)) - (P + P.T) / 2)
        return V[:, -rank:]
    return float(np.degrees(subspace_angles(removed(P_a), removed(P_b)).max()))


def row(name: str, t_ours: float, t_ref: float, acc_ours: float, acc_ref: float, extra: str = "") -> None:
    print(f"{name:<28} ours {t_ours:8.2f}s  ref {t_ref:8.2f}s  speed-up {t_ref / t_ours:6.1f}x  "
          f"acc ours {acc_ours:.4f}  ref {acc_ref:.4f}  {extra}", flush=True)


def bench_inlp(data: dict, ranks: list[int]) -> None:
    from cprobe.bench.reference import reference_inlp
    from cprobe.interventions.inlp import INLP

    Xt, zt = torch.from_numpy(data["X_train"]), torch.from_numpy(data["z_train"])
    X64 = data["X_train"].astype(np.float64)
    for rank in ranks:
        ours, t_ours = timed(lambda: INLP(rank).fit(Xt, zt))  # noqa: B023
        P_ours = ours.P.double().numpy()
        acc_ours = fresh_accuracy(data, P_ours)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the default solver's ConvergenceWarning, reported as the angle
            for label, kw in (("sklearn default (100 it)", {}), ("sklearn converged", {"max_iter": 5000})):
                (P_ref, _), t_ref = timed(lambda: reference_inlp(X64, data["z_train"], rank, **kw))  # noqa: B023
                row(f"INLP r={rank} vs {label}", t_ours, t_ref, acc_ours, fresh_accuracy(data, P_ref),
                    f"angle {removed_angle(P_ours, P_ref, rank):5.1f}°")


def bench_rlace(data: dict, weight_decay: float) -> None:
    from cprobe.bench.reference import reference_rlace
    from cprobe.interventions.rlace import RLACE

    Xt, zt = torch.from_numpy(data["X_train"]), torch.from_numpy(data["z_train"])
    ours, t_ours = timed(lambda: RLACE(1, weight_decay=weight_decay).fit(Xt, zt))
    P_ours = ours.P.double().numpy()
    ref, t_ref = timed(lambda: reference_rlace(data["X_train"].astype(np.float64), data["z_train"], rank=1,
                                               weight_decay=weight_decay))
    row("R-LACE r=1", t_ours, t_ref, fresh_accuracy(data, P_ours), fresh_accuracy(data, ref["P"]),
        f"steps ours {ours.steps_run} ref {ref['steps']}  angle {removed_angle(P_ours, ref['P'], 1):5.1f}°")


def bench_leace(data: dict) -> None:
    from concept_erasure import LeaceEraser

    from cprobe.interventions.leace import LEACE

    Xt, zt = torch.from_numpy(data["X_train"]), torch.from_numpy(data["z_train"])
    X64, onehot = Xt.double(), torch.nn.functional.one_hot(zt, 2).double()
    reps = 5
    ours, t_ours = timed(lambda: [LEACE().fit(Xt, zt) for _ in range(reps)][-1])
    ref, t_ref = timed(lambda: [LeaceEraser.fit(X64, onehot) for _ in range(reps)][-1])
    Xte = torch.from_numpy(data["X_test"])
    diff = (ours.transform(Xte).double() - ref(Xte.double())).abs().max().item()
    P_ours = ours.P.double().numpy()
    P_ref = (torch.eye(Xt.shape[1], dtype=torch.float64) - ref.proj_left @ ref.proj_right).numpy()
    row(f"LEACE (fit ×{reps})", t_ours, t_ref, fresh_accuracy(data, P_ours), fresh_accuracy(data, P_ref),
        f"max |Δ| {diff:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--npz", help="arrays X_train, z_train, X_test, z_test instead of the MiniLM/LGD fixture")
    ap.add_argument("--only", default="inlp,rlace,leace", help="comma-separated subset of inlp,rlace,leace")
    ap.add_argument("--inlp-ranks", default="8,32")
    ap.add_argument("--rlace-weight-decay", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 2)))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.npz:
        raw = np.load(args.npz)
        data = {k: raw[k] for k in ("X_train", "z_train", "X_test", "z_test")}
    else:
        from cprobe.bench.fixtures import minilm_lgd
        from cprobe.paths import cache_dir, data_dir

        fx = minilm_lgd(Path(data_dir()), Path(cache_dir()))
        data = {k: getattr(fx, k).numpy() for k in ("X_train", "z_train", "X_test", "z_test")}
    data["z_train"], data["z_test"] = data["z_train"].astype(np.int64), data["z_test"].astype(np.int64)
    majority = float((data["z_test"] == np.bincount(data["z_train"]).argmax()).mean())
    print(f"data: train {data['X_train'].shape}, test {len(data['X_test'])}; majority {majority:.4f}; "
          f"fresh LR before erasure {fresh_accuracy(data, np.eye(data['X_train'].shape[1])):.4f}; "
          f"threads {args.threads}", flush=True)
    only = set(args.only.split(","))
    if "leace" in only:
        bench_leace(data)
    if "inlp" in only:
        bench_inlp(data, [int(r) for r in args.inlp_ranks.split(",")])
    if "rlace" in only:
        bench_rlace(data, args.rlace_weight_decay)


if __name__ == "__main__":
    main()
