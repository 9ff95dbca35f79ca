"""``Intervention.edit_direction()``: the unit vector a rank-1 edit moves states along (issue 22, CausalGym's
``<name>_dir`` rows). Its property: every edited state differs from the original by a multiple of it."""

from __future__ import annotations

import pytest
import torch

from cprobe.interventions import INTERVENTIONS
from cprobe.interventions.base import projection_direction

RANK1 = {"leace": {"constrain_cov_trace": False}, "mean_diff": {}, "inlp": {"rank": 1}, "alterrep": {"rank": 1},
         "rlace": {"rank": 1, "max_steps": 300}}


def _data(n: int = 300, d: int = 6, k: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.arange(n) % k
    X = torch.randn(n, d, generator=g) @ torch.randn(d, d, generator=g) * 0.5
    X[:, 0] += 2.0 * z
    X[:, 1] -= 1.0 * z
    return X, z


@pytest.mark.parametrize("name", sorted(RANK1))
def test_a_rank1_edit_moves_every_state_along_its_direction_only(name):
    X, z = _data()
    method = INTERVENTIONS.build({"name": name, **RANK1[name]}, seed=0).fit(X, z)
    assert type(method).exposes_direction
    a = method.edit_direction()
    assert a is not None and a.shape == (X.shape[1],) and float(a.norm()) == pytest.approx(1.0, abs=1e-5)
    out = method.transform(X, 1 - z) if method.kind == "counterfactual" else method.transform(X)
    delta = (out - X).double()
    along = delta @ a.double()
    assert (delta - along[:, None] * a.double()).abs().max() < 1e-4  # nothing moves off the direction
    assert along.abs().max() > 1e-2  # and the edit does move states


def test_leace_and_mean_difference_share_the_class_mean_direction_on_a_binary_property():
    X, z = _data()
    leace = INTERVENTIONS.build({"name": "leace", "constrain_cov_trace": False}).fit(X, z).edit_direction()
    mean = INTERVENTIONS.build({"name": "mean_diff"}).fit(X, z).edit_direction()
    delta = X[z == 1].mean(0) - X[z == 0].mean(0)
    for a in (leace, mean):
        assert abs(float(a @ delta / delta.norm())) == pytest.approx(1.0, abs=1e-4)


def test_no_single_direction_for_higher_ranks_more_classes_or_nonlinear_edits():
    X, z = _data(k=3)
    assert INTERVENTIONS.build({"name": "leace", "constrain_cov_trace": False}).fit(X, z).edit_direction() is None
    assert INTERVENTIONS.build({"name": "mean_diff"}).fit(X, z).edit_direction() is None
    X2, z2 = _data()
    assert INTERVENTIONS.build({"name": "inlp", "rank": 2}).fit(X2, z2).edit_direction() is None
    assert not INTERVENTIONS.get("pgd").exposes_direction
    assert INTERVENTIONS.get("pgd").from_module(torch.nn.Linear(6, 2), 2, eps=0.1).edit_direction() is None


def test_projection_direction_recovers_the_removed_unit_vector():
    u = torch.tensor([3.0, 0.0, 4.0]) / 5
    assert projection_direction(torch.eye(3) - torch.outer(u, u)) == pytest.approx(u, abs=1e-6)
    v = torch.tensor([0.0, 1.0, 0.0])
    assert projection_direction(torch.eye(3) - torch.outer(u, u) - torch.outer(v, v)) is None  # rank 2 removed
    assert projection_direction(torch.eye(3)) is None  # nothing removed
