#!/usr/bin/env python
"""Why DiffMean trails the probe on Gemma 3's middle layers in the AxBench detection study (docs/axbench.md): the
study's own split, token states (read back from the activation cache of a run of
``cprobe run +experiment=axbench_detect model=gemma3_270m +dataset.max_examples=1500 'layers=[0,3,6,9,12,15,18]'``)
and fits, and per layer:

- cos(DiffMean, probe direction);
- the share of ‖μ₊ − μ₋‖² (token-level class means) in its 5 largest dimensions;
- the largest per-dimension standard deviation over the median one (outlier dimensions);
- the max-pooled AUROC of DiffMean, of the probe, and of DiffMean fitted and scored on standardised dimensions.

    python scripts/axbench_diffmean.py                       # gemma3_270m, layers 6 9 15
    python scripts/axbench_diffmean.py --model tiny_neox_sva --layers 2 4 --max-examples 3000
"""

from __future__ import annotations

import argparse
import types

import torch

from cprobe import api
from cprobe.cache import ActivationCache
from cprobe.directions import DIRECTIONS
from cprobe.metrics.detection import auroc, orient, pool, token_scores
from cprobe.paths import cache_dir
from cprobe.tasks import axbench as ax


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3_270m")
    p.add_argument("--layers", type=int, nargs="+", default=[6, 9, 15])
    p.add_argument("--max-examples", type=int, default=1500)
    args = p.parse_args()
    model = api.load_model(args.model)
    sp = ax.split(api.load_dataset("synthetic_sva", max_examples=args.max_examples), ax.Config(), 0)
    y = ax.checked_labels(sp, ["z_c=pl"])["z_c=pl"]
    items = ax.model_texts(sp.train + sp.test, model)
    ctx = types.SimpleNamespace(cache=ActivationCache(cache_dir()),
                                progress=False)
    states, mask, _ = ax.token_states(ctx, model, items, args.layers, 64, sp.name)
    train, test = torch.arange(len(sp.train)), torch.arange(len(sp.train), len(items))
    m_tr, m_te = mask[train], mask[test]
    y_tok = y[train][:, None].expand_as(m_tr)[m_tr]

    def detect(a: torch.Tensor, H: torch.Tensor, X: torch.Tensor) -> float:
        s = X.double() @ a.double()
        a = orient(a, s[y_tok == 1], s[y_tok == 0])
        return auroc(pool(token_scores(H[test], m_te, a), m_te, "max"), y[test])

    for layer in args.layers:
        H = states[layer]
        X = H[train][m_tr]
        diff = X[y_tok == 1].double().mean(0) - X[y_tok == 0].double().mean(0)
        sd = X.double().std(0)
        share = float((diff ** 2).sort(descending=True).values[:5].sum() / (diff ** 2).sum())
        a_mean = DIRECTIONS.build({"name": "mean"}).fit(X, y_tok).a
        a_probe = DIRECTIONS.build({"name": "probe"}).fit(X, y_tok).a
        scale = sd.float().clamp(min=1e-6)
        a_std = DIRECTIONS.build({"name": "mean"}).fit(X / scale, y_tok).a
        print(f"{args.model} layer {layer}: cos(mean, probe) {float(a_mean @ a_probe):.3f} · top-5 dims' share of "
              f"|mu+ - mu-|^2 {share:.3f} · max/median sd {float(sd.max() / sd.median()):.1f} · AUROC (max): mean "
              f"{detect(a_mean, H, X):.3f}, probe {detect(a_probe, H, X):.3f}, mean on standardised dims "
              f"{detect(a_std, H / scale, X / scale):.3f}")


if __name__ == "__main__":
    main()
