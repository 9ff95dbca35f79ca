"""``along: covariance`` — a direction intervention that sets the coordinate aᵀx by moving along Σa (the data's own
metric) instead of along a (issue 30: LDA's direction reads Z_c, but only moving along Σw, the class-mean difference,
moves the oracles and the model). Hand-computed cases and the property that makes it matter for LDA."""

from __future__ import annotations

import math

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

R2 = math.sqrt(2.0)


def _rows():
    """Class 0 at (0, 0), (0, 2); class 1 at (2, 2), (2, 4): μ₀ = (0, 1), μ₁ = (2, 3), a = (1, 1)/√2; centred on
    (1, 2) the rows are (−1, −2), (−1, 0), (1, 0), (1, 2), so Σ = [[1, 1], [1, 2]] (1/n), Σa = (2, 3)/√2,
    aᵀΣa = 2.5; t₀ = aᵀμ₀ = 1/√2, t₁ = aᵀμ₁ = 5/√2."""
    X = torch.tensor([[0.0, 0], [0, 2], [2, 2], [2, 4]], dtype=torch.float64)
    return X, torch.tensor([0, 0, 1, 1])


def test_counterfactual_along_the_covariance_hand_computed():
    """(0, 0) to z′ = 1: x + (5/√2 − 0) · (2, 3)/√2 / 2.5 = (2, 3); along a it is (0, 0) + (5/√2)(1, 1)/√2 =
    (2.5, 2.5). Both reach aᵀx′ = 5/√2."""
    X, z = _rows()
    cov = INTERVENTIONS.build({"name": "mean_direction", "along": "covariance"}).fit(X, z)
    plain = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    assert cov.targets_.tolist() == pytest.approx([1 / R2, 5 / R2])
    x, goal = torch.tensor([[0.0, 0.0], [2.0, 4.0]], dtype=torch.float64), torch.tensor([1, 0])
    # (2, 4) to z′ = 0: aᵀx = 6/√2, so x + (1/√2 − 6/√2)(2, 3)/(2.5√2) = (2, 4) − (2, 3) = (0, 1)
    torch.testing.assert_close(cov.transform(x, goal), torch.tensor([[2.0, 3.0], [0.0, 1.0]], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(plain.transform(x, goal), torch.tensor([[2.5, 2.5], [-0.5, 1.5]],
                                                                      dtype=torch.float64), atol=1e-6, rtol=0)


def test_nullifying_along_the_covariance_is_the_oblique_projection_hand_computed():
    """(2, 2): aᵀx = 2√2, x′ = x − 2√2 · (2, 3)/(2.5√2) = (2, 2) − 0.8 (2, 3) = (0.4, −0.4); aᵀx′ = 0."""
    X, z = _rows()
    m = INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying", "along": "covariance"}).fit(X, z)
    out = m.transform(torch.tensor([[2.0, 2.0], [1.0, -1.0]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[0.4, -0.4], [1.0, -1.0]], dtype=torch.float64), atol=1e-6, rtol=0)


def test_lda_moved_along_the_covariance_moves_along_the_class_mean_difference():
    """LDA's a ∝ Σ_W⁻¹(μ₁ − μ₀), so Σa ∝ μ₁ − μ₀ (Σ = Σ_W + c ΔμΔμᵀ). With a high-variance direction u at 0.1 rad
    from the class difference (as on the tiny models), a ≈ the part of μ₁ − μ₀ orthogonal to u: cos(a, μ₁ − μ₀) ≈
    sin 0.1; the edit along a moves the states almost orthogonally to the mean difference, the edit along Σa exactly
    along it, to the same coordinate."""
    g = torch.Generator().manual_seed(0)
    n, d = 400, 6
    z = torch.arange(n) % 2
    u = torch.zeros(d)
    u[0], u[1] = math.cos(0.1), math.sin(0.1)  # a high-variance direction 0.1 rad from the class difference e₀
    X = (torch.randn(n, d, generator=g) + 20.0 * torch.randn(n, 1, generator=g) * u).double()
    X[:, 0] += 1.5 * z
    dmu = X[z == 1].mean(0) - X[z == 0].mean(0)
    cov = INTERVENTIONS.build({"name": "lda_direction", "along": "covariance"}).fit(X, z)
    plain = INTERVENTIONS.build({"name": "lda_direction"}).fit(X, z)

    def cos(u: torch.Tensor, v: torch.Tensor) -> float:
        return float(u @ v / (u.norm() * v.norm()))

    assert abs(cos(plain.a.double(), dmu)) < 0.3  # LDA's own direction: nearly orthogonal to the mean difference
    goal = 1 - z
    moved = (cov.transform(X, goal) - X)[0]
    assert abs(cos(moved, dmu)) > 0.9999
    torch.testing.assert_close(cov.coordinate(cov.transform(X, goal)), plain.coordinate(plain.transform(X, goal)),
                               atol=1e-4, rtol=0)  # the same coordinate reached either way


def test_a_bad_along_is_a_one_line_error_and_a_flat_direction_is_refused():
    with pytest.raises(ConfigError, match=r"along must be one of \['direction', 'covariance'\]") as e:
        INTERVENTIONS.build({"name": "mean_direction", "along": "sigma"})
    assert "\n" not in str(e.value)
    from cprobe.errors import DataError

    X = torch.tensor([[0.0, 0], [0, 0], [1, 0], [1, 0]])  # no variance along y: fine along a = e₁, which varies
    INTERVENTIONS.build({"name": "mean_direction", "along": "covariance"}).fit(X, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(DataError, match="do not vary along the direction"):
        INTERVENTIONS.build({"name": "random_direction", "along": "covariance"}, seed=0).fit(
            torch.zeros(4, 2), torch.tensor([0, 0, 1, 1]))
