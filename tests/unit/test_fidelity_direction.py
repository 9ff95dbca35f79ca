"""The direction intervention's survivors of the mutation pass (issue 30, scripts/mutation.py), pinned by value: its
precision follows X, ``a`` and the untargeted coordinate are class 0's direction, bad targets are refused, the default
seed is 0."""

from __future__ import annotations

import math

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from tests.unit.test_fidelity_mutants import _three_classes

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def test_a_float64_edit_is_computed_in_float64():
    """Independent recomputation in float64 from the fitted A and targets: x + (t_{z′} − aᵀx) a agrees to 1e-12 (in
    float32 it would agree to ~1e-7 only)."""
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(50, 5, generator=g) * 1e3).double()
    z = torch.arange(50) % 2
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    a, t = m.A[0].double(), m.targets_.double()
    goal = 1 - z
    want = X + (t[goal] - X @ a)[:, None] * a
    out = m.transform(X, goal)
    assert out.dtype == torch.float64 and (out - want).abs().max().item() < 1e-9
    assert (m.coordinate(X) - X @ a).abs().max().item() < 1e-9
    f32 = m.transform(X.float(), goal)
    assert f32.dtype == torch.float32 and (f32.double() - want).abs().max().item() > 1e-7  # float32 is float32


def test_with_one_direction_per_class_a_and_the_plain_coordinate_are_class_0s():
    X, z = _three_classes()
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    a0 = torch.tensor([2.0, -1, -1], dtype=torch.float64) / math.sqrt(6.0)
    torch.testing.assert_close(m.a.double(), a0, atol=1e-6, rtol=0)
    x = torch.tensor([[6.0, 0, 0], [0, 0, 6]], dtype=torch.float64)
    torch.testing.assert_close(m.coordinate(x), x @ a0, atol=1e-6, rtol=0)  # no target: along a₀
    torch.testing.assert_close(m.coordinate(x, torch.tensor([2, 2])), x @ torch.tensor(
        [-1.0, -1, 2], dtype=torch.float64) / math.sqrt(6.0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("goal", [[3], [-1], [0, 3], [-1, 2]])
def test_a_target_outside_the_classes_is_refused(goal):
    X, z = _three_classes()
    m = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, z)
    with pytest.raises(ConfigError, match=r"z_target must be class ids in \[0, 3\)"):
        m.transform(X[:len(goal)], torch.tensor(goal))
    m.transform(X[:2], torch.tensor([0, 2]))  # the first and the last class are fine


def test_the_default_seed_is_0():
    X, z = _three_classes()
    cls = INTERVENTIONS.get("random_direction")
    torch.testing.assert_close(cls().fit(X, z).a, cls(seed=0).fit(X, z).a, atol=0, rtol=0)
    assert not torch.equal(cls().fit(X, z).a, cls(seed=1).fit(X, z).a)
