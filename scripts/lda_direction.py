#!/usr/bin/env python
"""Why LDA's direction moves no oracle (docs/methods.md, docs/reliability.md): on the reliability study's
intervention split, how LDA's direction w ∝ Σ⁻¹(μ₁ − μ₀) sits against the class-mean difference μ₁ − μ₀ the oracles
and the model read, and what moving along Σw instead gives.

    python scripts/lda_direction.py                                  # tiny BERT and tiny NeoX, layers 2 and 4
    python scripts/lda_direction.py --models tiny_bert_sva --layers 2

Per (model, layer) it prints: cos(w, μ₁ − μ₀); cos(Σw, μ₁ − μ₀) (Σ the covariance of the fitting rows: the move of
``along: covariance``); how well each coordinate reads Z_c on the test split (accuracy of the best threshold between
the class means: w reads it too); the class separation along each (|Δ coordinate| / pooled sd); and the cosine of
μ₁ − μ₀ with Σ's top principal direction with that direction's share of the variance — the class difference lies
along high-variance directions, which Σ⁻¹ discounts. The study's C / S / R for the two edits come from
``cprobe run -m +experiment=sva_tiny_reliability intervention=lda_direction intervention.along=direction,covariance
layers=2,4`` (and ``model=tiny_neox_sva``).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


def _threshold_accuracy(c: np.ndarray, y: np.ndarray, c_train: np.ndarray, y_train: np.ndarray) -> float:
    m0, m1 = c_train[y_train == 0].mean(), c_train[y_train == 1].mean()
    cut = (m0 + m1) / 2
    pred = (c > cut) if m1 > m0 else (c < cut)
    return float((pred.astype(int) == y).mean())


def measure(model_name: str, layers: list[int], seed: int = 0) -> list[dict]:
    import cprobe
    from cprobe.data.splits import make_splits
    from cprobe.interventions import INTERVENTIONS

    model = cprobe.load_model(model_name)
    data = cprobe.load_dataset("synthetic_sva")
    ex = cprobe.read_sites(model, data, layers=layers)
    ds = ex.dataset
    spec = {"fractions": {"oracle": 0.4, "intervention": 0.4, "test": 0.2}, "stratify": "z_c",
            "independent": {"oracle": ["z_c", "z_e"]}}  # conf/split/reliability.yaml
    splits = make_splits(ds, spec, seed)
    z = ds.labels("z_c")
    inter, test = splits["intervention"], splits["test"]
    rows = []
    for layer in layers:
        X = ex.acts[layer].double().numpy()
        Xi, zi = X[inter], z[inter]
        lda = INTERVENTIONS.build({"name": "lda_direction"}, seed=seed).fit(torch.from_numpy(Xi), torch.from_numpy(zi))
        w = lda.a.double().numpy()
        dmu = Xi[zi == 1].mean(0) - Xi[zi == 0].mean(0)
        Xc = Xi - Xi.mean(0)
        sigma_w = Xc.T @ (Xc @ w) / len(Xi)
        cos = lambda u, v: float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))  # noqa: E731
        evals, evecs = np.linalg.eigh(Xc.T @ Xc / len(Xi))
        top = evecs[:, -1]
        out = {"model": model_name, "layer": layer, "cos_w_dmu": cos(w, dmu), "cos_sigmaw_dmu": cos(sigma_w, dmu),
               "cos_dmu_top_pc": cos(dmu, top), "top_pc_variance_share": float(evals[-1] / evals.sum())}
        for name, v in (("w", w), ("dmu", dmu / np.linalg.norm(dmu))):
            c_tr, c_te = Xi @ v, X[test] @ v
            pooled = np.sqrt((c_tr[zi == 0].var() + c_tr[zi == 1].var()) / 2)
            out[f"acc_{name}"] = _threshold_accuracy(c_te, z[test], c_tr, zi)
            out[f"separation_{name}"] = float(abs(c_tr[zi == 1].mean() - c_tr[zi == 0].mean()) / pooled)
        rows.append(out)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny_bert_sva", "tiny_neox_sva"])
    ap.add_argument("--layers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import pandas as pd

    rows = [r for m in a.models for r in measure(m, a.layers, a.seed)]
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
