"""LEACE: equal to concept-erasure's eraser and removes linear predictability."""

from __future__ import annotations

import pytest
import torch
from concept_erasure import LeaceFitter

from cprobe.errors import ConfigError
from cprobe.interventions.inlp import fit_linear_classifier
from cprobe.interventions.leace import LEACE
from tests.unit.test_inlp import gaussian_classes


@pytest.mark.parametrize("k", [2, 3])
def test_matches_concept_erasure(k: int) -> None:
    X, z = gaussian_classes(800, 20, k)
    ours = LEACE().fit(X, z)
    onehot = torch.nn.functional.one_hot(z, k).double()
    ref = LeaceFitter.fit(X.double(), onehot, shrinkage=False, constrain_cov_trace=False).eraser
    assert torch.allclose(ours.transform(X).double(), ref(X.double()), atol=1e-4)
    assert torch.allclose(ours.P.double(), ref.P, atol=1e-4)


@pytest.mark.parametrize("k", [2, 3])
def test_erases_linear_information(k: int) -> None:
    X, z = gaussian_classes(2000, 16, k)
    Xe = LEACE().fit(X[:1000], z[:1000]).transform(X)
    # on the fitting split every class mean equals the global mean ...
    fit, zf = Xe[:1000], z[:1000]
    for c in range(k):
        assert torch.allclose(fit[zf == c].mean(0), fit.mean(0), atol=1e-3)
    # ... so a fresh linear probe does no better than chance on held-out rows
    W, b = fit_linear_classifier(fit, zf, k)
    logits = Xe[1000:] @ W.T + b
    pred = (logits[:, 0] > 0).long() if k == 2 else logits.argmax(-1)
    assert (pred == z[1000:]).float().mean() < 1 / k + 0.07


def test_rank_of_edit_and_options() -> None:
    X, z = gaussian_classes(500, 10, 3)
    leace = LEACE().fit(X, z)
    assert torch.linalg.matrix_rank(torch.eye(10) - leace.P).item() == 2  # k − 1 directions
    assert LEACE(affine=False).fit(X, z).bias is None
    with pytest.raises(ConfigError, match="svd_tol"):
        LEACE(svd_tol=0.0)
