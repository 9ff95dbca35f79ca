"""LDA's direction in closed form (issue 53) against scikit-learn's ``LinearDiscriminantAnalysis`` (the reference's SVD
solver, which cprobe called before), in one process, on random activations of CausalGym's shapes: n training pairs ×
d (Gemma 3 270M: d = 640; the reduced README command trains on 40 pairs, the paper on 200). Prints each fit's median
time, the ratio (scikit-learn's ÷ the closed form's) and 1 − the cosine between the two weights (checked < 1e-6).

    python scripts/bench_lda.py
    python scripts/bench_lda.py --shapes 40x640,200x640,2000x128 --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="40x640,200x640,400x128", help="comma-separated n x d")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # imported before timing

    from cprobe.directions.lda import lda_weight

    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, median of {args.repeats}")
    print("| n × d | scikit-learn, ms | closed form, ms | ratio | 1 − cos |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        n, d = (int(v) for v in shape.split("x"))
        g = torch.Generator().manual_seed(n * d)
        y = torch.arange(n) % 2
        X = torch.randn(n, d, generator=g) @ (torch.randn(d, d, generator=g) / d**0.5 + torch.eye(d)) \
            + y[:, None].float() * torch.randn(d, generator=g)
        Xn, yn = X.double().numpy(), y.numpy()
        ref = torch.from_numpy(LinearDiscriminantAnalysis(n_components=1).fit(Xn, yn).coef_[0])
        w = lda_weight(X, y)[0]
        gap = 1 - float(w @ ref / (w.norm() * ref.norm()))
        if gap > 1e-6:
            raise SystemExit(f"{shape}: the closed form's weight is off scikit-learn's by 1 − cos = {gap:.2e}")
        times: dict[str, list[float]] = {"sklearn": [], "closed": []}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            LinearDiscriminantAnalysis(n_components=1).fit(X.detach().to(torch.float64).numpy(), yn)
            times["sklearn"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lda_weight(X, y)
            times["closed"].append(time.perf_counter() - t0)
        a, b = statistics.median(times["sklearn"]), statistics.median(times["closed"])
        print(f"| {n} × {d} | {1e3 * a:.1f} | {1e3 * b:.1f} | **{a / b:.1f}×** | {gap:.1e} |", flush=True)


if __name__ == "__main__":
    main()
