"""MeanDiff steering: hand case, identity at α = 0, k = 3 targets reached."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.interventions.mean_diff import MeanDiff
from tests.unit.test_inlp import gaussian_classes


def test_hand_case() -> None:
    X = torch.tensor([[-1.0, 1.0], [-1.0, -1.0], [3.0, 1.0], [3.0, -1.0]])
    z = torch.tensor([0, 0, 1, 1])  # μ0 = (−1, 0), μ1 = (3, 0)
    md = MeanDiff().fit(X, z)
    assert torch.allclose(md.means, torch.tensor([[-1.0, 0.0], [3.0, 0.0]]))
    # rows nearest μ0 move by μ1 − μ0 = (4, 0); rows already nearest μ1 stay
    out = md.transform(torch.tensor([[-1.0, 1.0], [0.5, 2.0], [2.0, 0.0]]), torch.ones(3, dtype=torch.long))
    assert torch.allclose(out, torch.tensor([[3.0, 1.0], [4.5, 2.0], [2.0, 0.0]]))
    half = MeanDiff(alpha=0.5).fit(X, z).transform(X[:1], torch.ones(1, dtype=torch.long))
    assert torch.allclose(half, torch.tensor([[1.0, 1.0]]))


def test_alpha_zero_is_identity() -> None:
    X, z = gaussian_classes(200, 6)
    assert torch.equal(MeanDiff(alpha=0.0).fit(X, z).transform(X, 1 - z), X)


@pytest.mark.parametrize("k", [2, 3])
def test_reaches_every_target(k: int) -> None:
    X, z = gaussian_classes(900, 12, k, sep=8.0)
    md = MeanDiff().fit(X, z)
    assert md.basis.shape[1] == k - 1
    for t in range(k):
        target = torch.full_like(z, t)
        assert (md.nearest_class(md.transform(X, target)) == target).float().mean() > 0.95


def test_errors() -> None:
    X, z = gaussian_classes(100, 4)
    with pytest.raises(ConfigError, match="z_target"):
        MeanDiff().fit(X, z).transform(X)
    with pytest.raises(ConfigError, match="no rows"):
        MeanDiff().fit(X, torch.where(z == 1, 2, 0))
    with pytest.raises(ConfigError, match="alpha"):
        MeanDiff(alpha=-0.1)
