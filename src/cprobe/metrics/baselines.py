"""Reference accuracies a probe or oracle must beat to mean anything."""

from __future__ import annotations

import numpy as np
from torch import Tensor


def majority_baseline(y_train: np.ndarray | Tensor, y_test: np.ndarray | Tensor) -> float:
    """Accuracy on ``y_test`` of always predicting the most frequent class of ``y_train`` (ties: lowest id)."""
    tr = y_train.cpu().numpy() if isinstance(y_train, Tensor) else np.asarray(y_train)
    te = y_test.cpu().numpy() if isinstance(y_test, Tensor) else np.asarray(y_test)
    if tr.size == 0 or te.size == 0:
        raise ValueError("majority baseline needs non-empty train and test labels")
    return float((te == np.bincount(tr).argmax()).mean())
