"""Interventions as explainers (cprobe.explainers.intervention): the bridged explainers equal the home explainers
where both apply (in one process, on the same data), follow the intervention's declared kind, and are refused by
capability where a study cannot run them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.explainers import EXPLAINERS, ExplainedModel
from cprobe.interventions import INTERVENTIONS
from cprobe.tasks.effects import refusal
from cprobe.testing import SMALL_PROBE
from tests.unit.test_explainers import queries_for, world  # noqa: F401  (world is a fixture)


def test_every_intervention_not_trained_through_the_model_is_bridged_by_its_kind():
    for name in INTERVENTIONS.names():
        cls = INTERVENTIONS.get(name)
        if cls.needs_model:  # DAS: trained on minimal pairs through the model, not from φ(x)
            assert f"via_{name}" not in EXPLAINERS
            continue
        ex = EXPLAINERS.get(f"via_{name}")
        assert ex.needs_representation and ex.removal_only == (cls.kind == "nullifying")


def test_removal_only_bridges_are_refused_where_no_value_means_absent():
    why = refusal(EXPLAINERS.get("via_rlace"), ("food",), False, "liberty")
    assert why and "models concept removal only" in why
    assert refusal(EXPLAINERS.get("via_pgd"), ("food",), False, "liberty") is None  # counterfactual: runs
    with pytest.raises(ConfigError, match="via_inlp.*rank"):
        EXPLAINERS.build({"name": "via_inlp"})
    with pytest.raises(ConfigError, match="kind is the intervention's declared"):
        EXPLAINERS.build({"name": "via_mean_direction", "kind": "nullifying"})


def test_via_leace_equals_the_home_leace_explainer(world):  # noqa: F811
    model, train, _, _ = world
    q = queries_for(train, range(0, 600, 7), "food", "Negative", "unknown")
    home = EXPLAINERS.build({"name": "leace", "diagnose": False}).fit(model, train).explain(q)
    bridged = EXPLAINERS.build({"name": "via_leace"}).fit(model, train).explain(q)
    np.testing.assert_allclose(bridged, home, atol=1e-7)
    assert np.abs(home).max() > 0.05  # the food concept carries the model's decision: removing it matters


def test_via_inlp_equals_the_home_inlp_explainer_without_its_head_retraining(world):  # noqa: F811
    """The home INLP explainer re-trains a copy of the head on the projected states (CEBaB App. F); with no epochs of
    it, and the same number of directions (iterations · k for a k = 3 concept), the bridge gives its numbers."""
    model, train, _, _ = world
    model = ExplainedModel(model.head, model.n_classes, ("service",), model.values)  # one concept: half the fits
    q = queries_for(train, range(0, 600, 5), "service", "Positive", "unknown")
    home = EXPLAINERS.build({"name": "inlp", "iterations": 1, "head_epochs": 0, "diagnose": False})
    bridged = EXPLAINERS.build({"name": "via_inlp", "rank": 3})
    np.testing.assert_allclose(bridged.fit(model, train).explain(q), home.fit(model, train).explain(q), atol=1e-6)


def test_a_counterfactual_bridge_sets_the_query_target_value(world):  # noqa: F811
    """via_mean_diff's estimate is N(mean-difference steering of φ to c′) − N(φ), computed here by hand; moving food
    from Negative to Positive raises the class the model reads food's sentiment into (its weight is +2)."""
    model, train, X, W = world
    rows = [i for i in range(600) if train.concepts[i]["food"] == "Negative"][:40]
    q = queries_for(train, rows, "food", "Negative", "Positive")
    out = EXPLAINERS.build({"name": "via_mean_diff"}).fit(model, train).explain(q)
    from cprobe.explainers.base import concept_targets
    from cprobe.interventions.mean_diff import MeanDiff

    z = concept_targets(train.concepts, "food", model.values)
    md = MeanDiff().fit(train.reps, torch.from_numpy(z))
    steered = md.transform(train.reps[torch.tensor(rows)], torch.full((len(rows),), 1))
    np.testing.assert_allclose(out, model.head_probs(steered) - train.probs[rows], atol=1e-6)
    assert out[:, 1].mean() > 0.2
    # the direction bridge and the gradient attack agree in sign
    for name, extra in (("via_mean_direction", {}), ("via_pgd", {"eps": 3.0, "probe": SMALL_PROBE})):
        est = EXPLAINERS.build({"name": name, **extra}, seed=0).fit(model, train).explain(q)
        assert est[:, 1].mean() > 0.1, name


def test_a_gradient_attacks_probe_fits_through_the_probe_fit_cache(world, tmp_path, monkeypatch):  # noqa: F811
    """The attacked probe fits through the content-keyed probe-fit cache (``probe_cache``, as the effects engine
    passes it): one entry per concept's training rows; a second explainer reads them back (no fit, no new entry)
    and gives the same estimates as a fit without the cache."""
    from cprobe.probes import grid

    model, train, X, W = world
    rows = [i for i in range(600) if train.concepts[i]["food"] == "Negative"][:40]
    q = queries_for(train, rows, "food", "Negative", "Positive")
    cfg = {"name": "via_pgd", "eps": 3.0, "probe": SMALL_PROBE}
    plain = EXPLAINERS.build(cfg, seed=0).fit(model, train).explain(q)
    cached = EXPLAINERS.build(cfg, seed=0, probe_cache=tmp_path).fit(model, train).explain(q)
    entries = sorted(tmp_path.glob("*.safetensors"))
    assert len(entries) == len(model.concepts)
    fits: list[int] = []
    real = grid.GridSearchProbe.fit
    monkeypatch.setattr(grid.GridSearchProbe, "fit", lambda self, *a, **k: fits.append(1) or real(self, *a, **k))
    again = EXPLAINERS.build(cfg, seed=0, probe_cache=tmp_path).fit(model, train).explain(q)
    assert fits == [] and sorted(tmp_path.glob("*.safetensors")) == entries
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_array_equal(again, plain)
