"""R-LACE: Fantope projection, a rank-r orthogonal projection, and erased linear information."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.interventions.inlp import fit_linear_classifier
from cprobe.interventions.rlace import RLACE, project_fantope
from tests.unit.test_inlp import gaussian_classes


def test_fantope_projection() -> None:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(8, 8, generator=g)
    F = project_fantope(A + A.T, 3)
    lam = torch.linalg.eigvalsh(F)
    assert torch.trace(F).item() == pytest.approx(3.0, abs=1e-4)
    assert lam.min() > -1e-5 and lam.max() < 1 + 1e-5
    E = torch.diag(torch.tensor([1.0, 1.0, 1.0, 0, 0, 0, 0, 0]))  # already in the Fantope
    assert torch.allclose(project_fantope(E, 3), E, atol=1e-5)


def test_projection_and_erasure() -> None:
    X, z = gaussian_classes(1200, 12)
    tr, te = slice(0, 600), slice(600, None)
    rlace = RLACE(1, lr=0.05, epochs=30, seed=0).fit(X[tr], z[tr])  # 10x the paper lr: converges in ~1 s
    P = rlace.P
    assert torch.allclose(P, P.T, atol=1e-5)
    assert torch.allclose(P @ P, P, atol=1e-5)
    assert torch.linalg.matrix_rank(P).item() == 11
    Xp = rlace.transform(X)
    W, b = fit_linear_classifier(Xp[tr], z[tr], 2)
    acc = (((Xp[te] @ W.T + b)[:, 0] > 0).long() == z[te]).float().mean().item()
    assert acc < 0.6  # balanced classes: majority rate 0.5 (was ~1.0 before)


def test_seed_reproducible_and_rank_zero() -> None:
    X, z = gaussian_classes(300, 6)
    a = RLACE(1, epochs=3, seed=1).fit(X, z).P
    assert torch.equal(a, RLACE(1, epochs=3, seed=1).fit(X, z).P)
    assert torch.equal(RLACE(0).fit(X, z).transform(X), X)


def test_bad_hyperparameters() -> None:
    X, z = gaussian_classes(50, 4)
    with pytest.raises(ConfigError, match="exceeds the embedding size 4"):
        RLACE(5).fit(X, z)
    with pytest.raises(ConfigError, match="lr"):
        RLACE(1, lr=-0.1)
    with pytest.raises(ConfigError, match="optimizer"):
        RLACE(1, optimizer="rmsprop")  # type: ignore[arg-type]
