"""LEACE: equal to concept-erasure's eraser and removes linear predictability."""

from __future__ import annotations

import pytest
import torch
from concept_erasure import LeaceFitter
from sklearn.linear_model import LogisticRegression

from cprobe.errors import ConfigError
from cprobe.interventions.leace import LEACE
from tests.unit.test_inlp import gaussian_classes


def _anisotropic(n: int, d: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Correlated features with a class shift off the principal axes (an oblique eraser)."""
    X, z = gaussian_classes(n, d, k)
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g) * torch.logspace(0, -2, d)
    return X @ mix + 0.3 * X, z


@pytest.mark.parametrize("options", [{}, {"shrinkage": False, "constrain_cov_trace": False},
                                     {"shrinkage": True, "constrain_cov_trace": False},
                                     {"shrinkage": False, "constrain_cov_trace": True}])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("data", [gaussian_classes, _anisotropic])
def test_matches_concept_erasure(k: int, options: dict, data) -> None:
    """Defaults are LeaceEraser.fit's (shrinkage and the trace constraint on); every variant matches."""
    X, z = data(800, 20, k)
    ours = LEACE(**options).fit(X, z)
    onehot = torch.nn.functional.one_hot(z, k).double()
    ref = LeaceFitter.fit(X.double(), onehot, **options).eraser
    assert torch.allclose(ours.transform(X).double(), ref(X.double()), atol=1e-4)
    eye = torch.eye(X.shape[1], dtype=torch.float64)
    assert torch.allclose(ours.P.double(), eye - ref.proj_left @ ref.proj_right, atol=1e-4)


def test_trace_constraint_hand_computed() -> None:
    """Σ = I, u = e₁, I − P = [[1, 0], [2, 0]]: tr(PPᵀ) = 5 > 2, so αP + (1 − α)Q with Q = diag(0, 1):
    tr = 4α² + 1 = 2 ⇒ α = ½ and I − P_α = ½[[1, 0], [2, 0]] + ½ e₁e₁ᵀ = [[1, 0], [1, 0]].

    (With P built from the same Σ the trace can only fall — tr(PΣPᵀ) = tr Σ − ‖Σ^{1/2}u‖² — so the mixture
    is a numerical safeguard, as in concept-erasure.)"""
    from cprobe.interventions.leace import _constrain_trace

    e1 = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    left, right = _constrain_trace(torch.tensor([[1.0], [2.0]], dtype=torch.float64), e1.T, e1,
                                   torch.eye(2, dtype=torch.float64))
    assert torch.allclose(left @ right, torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
    same, _ = _constrain_trace(0.5 * e1, e1.T, e1, torch.eye(2, dtype=torch.float64))
    assert torch.equal(same, 0.5 * e1)  # trace not increased: unchanged


def test_shrinkage_hand_computed() -> None:
    """S = diag(2, 0), n = 4: target = I, α = 1 − (tr²·‖T‖²/n)/(‖S‖²‖T‖² − tr(ST)²) = 1 − 2/4 = 0.5, β = 0.5."""
    from cprobe.interventions.leace import shrunk_covariance

    S = torch.diag(torch.tensor([2.0, 0.0], dtype=torch.float64))
    assert torch.allclose(shrunk_covariance(S, 4), torch.diag(torch.tensor([1.5, 0.5], dtype=torch.float64)))


@pytest.mark.parametrize("k", [2, 3])
def test_erases_linear_information(k: int) -> None:
    X, z = gaussian_classes(2000, 16, k)
    Xe = LEACE().fit(X[:1000], z[:1000]).transform(X)
    # on the fitting split every class mean equals the global mean ...
    fit, zf = Xe[:1000], z[:1000]
    for c in range(k):
        assert torch.allclose(fit[zf == c].mean(0), fit.mean(0), atol=1e-3)
    # ... so an independent adversary (scikit-learn) does no better than chance on held-out rows
    clf = LogisticRegression(max_iter=1000).fit(fit.numpy(), zf.numpy())
    assert clf.score(Xe[1000:].numpy(), z[1000:].numpy()) < 1 / k + 0.07


def test_rank_of_edit_and_options() -> None:
    X, z = gaussian_classes(500, 10, 3)
    leace = LEACE().fit(X, z)
    assert torch.linalg.matrix_rank(torch.eye(10) - leace.P).item() == 2  # k − 1 directions
    assert LEACE(affine=False).fit(X, z).bias is None
    with pytest.raises(ConfigError, match="svd_tol"):
        LEACE(svd_tol=0.0)
