"""AlterRep: α = 0 is INLP; the rowspace coordinates land on z′'s side; probes follow."""

from __future__ import annotations

import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from cprobe.errors import ConfigError
from cprobe.interventions.alterrep import AlterRep
from cprobe.interventions.inlp import INLP
from tests.unit.test_inlp import gaussian_classes


def test_alpha_zero_equals_inlp_exactly() -> None:
    X, z = gaussian_classes(400, 12)
    alter = AlterRep(3, alpha=0.0).fit(X, z)
    target = 1 - z
    assert torch.equal(alter.transform(X, target), INLP(3).fit(X, z).transform(X))


@pytest.mark.parametrize(("k", "rank"), [(2, 3), (3, 6)])
def test_rowspace_coordinates_are_set(k: int, rank: int) -> None:
    X, z = gaussian_classes(300, 10, k)
    alter = AlterRep(rank, alpha=0.7).fit(X, z)
    target = (z + 1) % k
    out = alter.transform(X, target)
    U = alter.inlp.directions
    before, after = X @ U.T, out @ U.T
    sign = torch.where(alter.inlp.row_classes[None, :] == target[:, None], 1.0, -1.0)
    assert torch.allclose(after, 0.7 * sign * before.abs(), atol=1e-4)
    # the nullspace part is untouched
    assert torch.allclose(out @ alter.inlp.P, X @ alter.inlp.P, atol=1e-4)


def test_binary_matches_paper_formula() -> None:
    X, z = gaussian_classes(200, 8)
    alter = AlterRep(2, alpha=1.5).fit(X, z)
    P, U = alter.inlp.P, alter.inlp.directions
    h = X[:5]
    expected = h @ P + 1.5 * (h @ U.T).abs() @ U  # z′ = 1: every component on the positive side
    assert torch.allclose(alter.transform(h, torch.ones(5, dtype=torch.long)), expected, atol=1e-5)


@pytest.mark.parametrize("k", [2, 3])
def test_moves_probe_prediction_to_target(k: int) -> None:
    X, z = gaussian_classes(1000, 16, k)
    # an independent probe; one-vs-rest like the k > 2 rows AlterRep sets
    clf = OneVsRestClassifier(LogisticRegression(max_iter=2000)).fit(X.numpy(), z.numpy())
    alter = AlterRep(2 if k == 2 else 6, alpha=1.0).fit(X, z)
    for t in range(k):
        target = torch.full_like(z, t)
        pred = clf.predict(alter.transform(X, target).numpy())
        assert (pred == target.numpy()).mean() > 0.95


def test_requires_target_and_valid_alpha() -> None:
    X, z = gaussian_classes(100, 4)
    alter = AlterRep(1).fit(X, z)
    with pytest.raises(ConfigError, match="z_target"):
        alter.transform(X)
    with pytest.raises(ConfigError, match=r"\[0, 2\)"):
        alter.transform(X, torch.full_like(z, 2))
    with pytest.raises(ConfigError, match="alpha"):
        AlterRep(1, alpha=-1.0)
