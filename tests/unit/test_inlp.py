"""INLP: the projection's algebra and that it removes linear predictability."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles
from sklearn.linear_model import LogisticRegression

from cprobe.errors import ConfigError
from cprobe.interventions.inlp import INLP


def gaussian_classes(n: int, d: int, k: int = 2, sep: float = 6.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian classes with a shared anisotropic covariance (decaying spectrum, like LM states)
    and means at distance ``sep / 2`` from the origin along random directions."""
    g = torch.Generator().manual_seed(seed)
    z = torch.arange(n) % k
    means = torch.randn(k, d, generator=g)
    means = sep / 2 * means / means.norm(dim=1, keepdim=True)
    scales = 2.0 / torch.arange(1, d + 1).float().sqrt()
    return torch.randn(n, d, generator=g) * scales + means[z], z


def linear_accuracy(X_tr, z_tr, X_te, z_te, k: int) -> float:
    """Held-out accuracy of an independent adversary: scikit-learn's logistic regression."""
    clf = LogisticRegression(max_iter=2000).fit(X_tr.double().numpy(), z_tr.numpy())
    return float(clf.score(X_te.double().numpy(), z_te.numpy()))


@pytest.mark.parametrize(("k", "rank"), [(2, 3), (3, 5)])
def test_projection_algebra(k: int, rank: int) -> None:
    X, z = gaussian_classes(600, 24, k)
    inlp = INLP(rank).fit(X, z)
    P = inlp.P
    assert torch.allclose(P, P.T, atol=1e-6)
    assert torch.allclose(P @ P, P, atol=1e-5)
    assert torch.linalg.matrix_rank(P).item() == 24 - rank
    assert inlp.directions.shape == (rank, 24)
    assert torch.allclose(inlp.directions.norm(dim=1), torch.ones(rank), atol=1e-5)
    assert (inlp.directions @ P).abs().max() < 1e-5  # every classifier lies in the removed space
    if k == 2:  # binary normals come out orthonormal, one per iteration
        assert torch.allclose(inlp.directions @ inlp.directions.T, torch.eye(rank), atol=1e-5)
    else:  # one-vs-rest rows: the first iteration has one row per class
        assert sorted(inlp.row_classes[:k].tolist()) == list(range(k))


def test_biases_give_signed_distances() -> None:
    X, z = gaussian_classes(400, 8)
    inlp = INLP(1).fit(X, z)
    dist = X @ inlp.directions[0] + inlp.biases[0]
    assert ((dist > 0).long() == z).float().mean() > 0.9  # class 1 on the positive side


@pytest.mark.parametrize("k", [2, 3])
def test_removes_linear_predictability(k: int) -> None:
    X, z = gaussian_classes(2000, 16, k)
    tr, te = slice(0, 1000), slice(1000, None)
    before = linear_accuracy(X[tr], z[tr], X[te], z[te], k)
    inlp = INLP(6 if k == 2 else 12).fit(X[tr], z[tr])
    Xp = inlp.transform(X)
    after = linear_accuracy(Xp[tr], z[tr], Xp[te], z[te], k)
    assert before > 0.9
    assert after < 1 / k + 0.07


@pytest.mark.parametrize(("n", "d"), [(600, 128), pytest.param(1000, 768, marks=pytest.mark.slow)])
def test_rank_40(n: int, d: int) -> None:
    # LR-based INLP stops once the projected class means coincide (then W = 0 is optimal);
    # with these sizes the anisotropic classes keep a residual signal for 40 rounds.
    X, z = gaussian_classes(n, d)
    inlp = INLP(40).fit(X, z)
    assert torch.linalg.matrix_rank(inlp.P).item() == d - 40
    assert (inlp.directions @ inlp.P).abs().max() < 1e-5


def test_rank_zero_is_identity_and_deterministic() -> None:
    X, z = gaussian_classes(200, 6)
    assert torch.equal(INLP(0).fit(X, z).transform(X), X)
    assert torch.equal(INLP(2).fit(X, z).P, INLP(2).fit(X, z).P)


def test_transform_keeps_dtype() -> None:
    X, z = gaussian_classes(200, 6)
    out = INLP(1).fit(X, z).transform(X.double())
    assert out.dtype == torch.float64 and out.shape == X.shape


def test_bad_rank() -> None:
    X, z = gaussian_classes(100, 5)
    with pytest.raises(ConfigError, match="exceeds the embedding size 5"):
        INLP(6).fit(X, z)
    with pytest.raises(ConfigError, match="non-negative"):
        INLP(-1)
    with pytest.raises(ConfigError, match="C must be"):
        INLP(1, C=0)


@pytest.mark.parametrize("C", [1.0, 0.05])
def test_directions_are_the_reference_loops(C: float) -> None:
    """Each direction is the normal of scikit-learn's LogisticRegression(C) fitted to convergence on the data
    projected onto the nullspace of the earlier ones (the reference INLP loop): same subspace, same order."""
    from cprobe.bench.reference import reference_inlp

    X, z = gaussian_classes(600, 12, sep=2.0)
    ours = INLP(4, C=C).fit(X, z)
    _, W = reference_inlp(X.double().numpy(), z.numpy(), 4, C=C, max_iter=10_000, tol=1e-10)
    ref = W / np.linalg.norm(W, axis=1, keepdims=True)
    got = ours.directions.double().numpy()
    for i in range(4):  # direction i spans the same line as the reference's i-th (after orthogonalising)
        angle = np.degrees(subspace_angles(got[: i + 1].T, ref[: i + 1].T).max())
        assert angle < 0.05, (i, angle)
    assert abs(got[0] @ ref[0]) > 1 - 1e-8


def test_l2_option_is_a_per_sample_penalty() -> None:
    """l2 = 1/(C·n) is the same objective as C."""
    X, z = gaussian_classes(500, 8, sep=2.0)
    a = INLP(2, C=0.3).fit(X, z).directions
    b = INLP(2, l2=1 / (0.3 * 500)).fit(X, z).directions
    assert torch.allclose(a, b, atol=1e-8)
