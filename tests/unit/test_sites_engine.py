"""The sites engine's helpers (issue 31 item 2): fitting an intervention by its declared capabilities
(``fit_intervention``), applying it by its kind (``apply``, ``check_goal``), the one completeness scorer of edited
states read at any layer (``metrics.reliability.completeness``), and the per-row-site edit and batch
(``models/multisite.py``). Hand-computed cases; no model."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError, DataError
from cprobe.interventions.base import Intervention, apply, check_goal, fit_intervention, n_classes_of, needs_goal
from cprobe.metrics.reliability import completeness
from cprobe.models.edits import Apply
from cprobe.models.multisite import rowwise_dii, site_batch
from cprobe.models.sites import Batch, Site


class _Toy(Intervention):
    """Records how it was fitted; transform: nullifying → 0·X, counterfactual → X + goal (per row)."""

    kind = "nullifying"

    def __init__(self, kind: str = "nullifying") -> None:
        self.kind = kind  # type: ignore[misc]
        self.calls: list[tuple] = []

    def fit(self, X, z, through=None):
        self.calls.append(("fit", None if through is None else through))
        return self

    def use_probe(self, probe):
        self.calls.append(("use_probe", probe))
        return self

    def transform(self, X, z_target=None):
        return X * 0 if z_target is None else X + z_target[:, None].to(X.dtype)


class _Probe(_Toy):
    needs_probe = True


class _Model(_Toy):
    needs_model = True


X = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
Z = torch.tensor([0, 1])


def test_fit_intervention_dispatches_on_the_declared_capabilities_and_calls_only_what_is_needed():
    asked = []

    def probe():
        asked.append("probe")
        return "the probe"

    def through():
        asked.append("through")
        return "the pairs"

    plain = fit_intervention(_Toy(), X, Z, probe=probe, through=through)
    assert plain.calls == [("fit", None)] and asked == []  # neither built for a plain fit
    attack = fit_intervention(_Probe(), X, Z, probe=probe, through=through)
    assert attack.calls == [("use_probe", "the probe")] and asked == ["probe"]
    das = fit_intervention(_Model(), X, Z, probe=probe, through=through)
    assert das.calls == [("fit", "the pairs")] and asked == ["probe", "through"]
    # an attack given no probe trains its own in fit (the conformance suite's way)
    assert fit_intervention(_Probe(), X, Z).calls == [("fit", None)]
    with pytest.raises(ConfigError, match="needs minimal pairs at one edit site"):
        fit_intervention(_Model(), X, Z)


def test_apply_dispatches_on_kind_hand_computed():
    null, cf = _Toy("nullifying").fit(X, Z), _Toy("counterfactual").fit(X, Z)
    assert not needs_goal(null) and needs_goal(cf)
    assert apply(null, X).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert apply(cf, X, torch.tensor([1, 0])).tolist() == [[2.0, 3.0], [3.0, 4.0]]


def test_counterfactual_needs_a_goal_and_nullifying_takes_none_in_one_rule():
    null, cf = _Toy("nullifying").fit(X, Z), _Toy("counterfactual").fit(X, Z)
    with pytest.raises(ConfigError, match="needs targets"):
        apply(cf, X)
    with pytest.raises(ConfigError, match="takes no targets"):
        apply(null, X, Z)
    check_goal(null, None)
    check_goal(cf, Z)
    # the live in-model edit checks the same rule (through the intervention's check_goal)
    with pytest.raises(ConfigError, match="needs targets"):
        Apply(cf)
    with pytest.raises(ConfigError, match="takes no targets"):
        Apply(null, Z)


def test_n_classes_of_counts_classes_from_the_largest_id():
    assert n_classes_of(torch.tensor([0, 2, 1, 2])) == 3
    assert n_classes_of(torch.tensor([1, 3])) == 4  # ids, not distinct values
    with pytest.raises(DataError, match="single class"):
        n_classes_of(torch.tensor([1, 1]))


def test_completeness_by_kind_row_by_row_hand_computed():
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    goal = torch.tensor([1, 1, 1])
    # counterfactual: 1 − ½(|p0 − 0| + |p1 − 1|) = P(goal): 0.5, 0.1, 0.8
    assert completeness(p, goal).tolist() == pytest.approx([0.5, 0.1, 0.8])
    # nullifying (k = 2): 1 − 2·½Σ|p − ½|: 1, 0.2, 0.4
    assert completeness(p).tolist() == pytest.approx([1.0, 0.2, 0.4])
    # rows of both kinds in one pass: each row by its own edit's kind
    mixed = completeness(p, goal, torch.tensor([True, False, True]))
    assert mixed.tolist() == pytest.approx([1.0, 0.1, 0.4])
    assert completeness(p, goal, False).tolist() == pytest.approx([0.5, 0.1, 0.8])


def test_rowwise_dii_hand_computed():
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    source = torch.tensor([[3.0, 3.0], [5.0, 5.0], [0.0, 4.0]])
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    whole = torch.tensor([False, True, False])
    # row 0: h + ((s − h)·a) a = [1, 0] + 2·[1, 0]; row 1: the whole source; row 2: [2, 2] + 2·[0, 1]
    assert rowwise_dii(source, a, whole)(h).tolist() == [[3.0, 0.0], [5.0, 5.0], [2.0, 4.0]]
    assert rowwise_dii(source, a)(h)[1].tolist() == [0.0, 5.0]  # no whole: the DII on row 1 too
    assert rowwise_dii(source, a)(h.half()).dtype == torch.float16  # cast back


def test_rowwise_dii_of_k_dimensional_bases_hand_computed():
    """Bases (n, d, k): row r takes span R_r from the source, h + R Rᵀ (s − h); a (n, d, 1) basis is the 1-D DII."""
    h = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    source = torch.tensor([[4.0, 5.0, 6.0], [4.0, 5.0, 6.0]])
    e = torch.eye(3)
    R = torch.stack([e[:, :2], torch.stack([e[0], (e[1] + e[2]) / 2 ** 0.5], 1)])
    # row 0: the first two coordinates swapped; row 1: the first, and (s − h)·(e₂ + e₃)/√2 = 3√2 along it: + (0, 3, 3)
    torch.testing.assert_close(rowwise_dii(source, R)(h), torch.tensor([[4.0, 5.0, 3.0], [4.0, 5.0, 6.0]]))
    a = torch.nn.functional.normalize(torch.tensor([[1.0, 2.0, 2.0], [0.0, 3.0, 4.0]]), dim=-1)
    torch.testing.assert_close(rowwise_dii(source, a[:, :, None])(h), rowwise_dii(source, a)(h))
    assert rowwise_dii(source, R)(h.half()).dtype == torch.float16


def test_site_batch_puts_each_row_at_its_own_site_and_leaves_other_layers_alone():
    """Three items, two positions; rows pick (item, site) pairs. One synthetic position per layer of the sites
    used, holding each row's position where its site is at that layer and −1 elsewhere."""
    batch = Batch(input_ids=torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0], [5, 6, 7, 8]]),
                  attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]),
                  positions={"a": torch.tensor([0, 1, 2]), "b": torch.tensor([2, -1, 3])},
                  rows=torch.tensor([10, 11, 12]))
    sites = [Site(1, "a"), Site(2, "b"), Site(1, "b"), Site(3, "a")]  # site 3 unused below
    items = torch.tensor([0, 2, 2, 1])
    row_site = torch.tensor([0, 1, 2, 0])
    sub, at = site_batch(batch, items, row_site, sites)
    assert at == [Site(1, "sites@1.resid"), Site(2, "sites@2.resid")]  # layers 1 and 2 only
    assert sub.positions["sites@1.resid"].tolist() == [0, -1, 3, 1]  # rows 0, 2, 3 edit at layer 1
    assert sub.positions["sites@2.resid"].tolist() == [-1, 3, -1, -1]  # row 1 at layer 2 (item 2's "b")
    assert sub.input_ids.tolist() == [[5, 6, 7, 0], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 0, 0]]
    assert sub.rows.tolist() == [0, 1, 2, 3]  # per-row edit data is indexed by the row
