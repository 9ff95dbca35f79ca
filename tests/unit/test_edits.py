"""models/edits.py::Apply — a fitted estimator as a live in-model edit: applied in the model it equals Replace of the
transformed states of the same pass (an eraser; a counterfactual intervention with per-item targets; a plain
function), and it refuses what it cannot apply."""

from __future__ import annotations

import pytest
import torch

from cprobe.data.items import TextItem
from cprobe.errors import ConfigError, NotFittedError
from cprobe.interventions.leace import LEACE
from cprobe.interventions.mean_diff import MeanDiff
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply, Replace
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.sites import Site
from tests.conftest import make_random_model

TEXTS = ["the author is here .", "the authors are here .", "the guard near that author was here .",
         "the guards like the author .", "w1 w2 w3 w4", "the author likes guards , w5 ."]


@pytest.fixture(scope="module")
def setup():
    model, tok = make_random_model("gpt2")
    adapter = ModelAdapter(model.transformer, tok, "encoder", "tiny", batch_size=4)
    items = [TextItem(str(i), t) for i, t in enumerate(TEXTS * 3)]
    fmt = ClassificationFormatter(32)
    site, after = Site(1, "last"), Site(3, "last")
    X = adapter.map(items, fmt, read=[site]).acts[site]
    z = torch.tensor([i % 2 for i in range(len(items))])
    return adapter, items, fmt, site, after, X, z


def _downstream(adapter, items, fmt, site, after, spec):
    return adapter.map(items, fmt, read=[after], edits={site: spec}).acts[after]


def test_an_eraser_applied_in_the_model_equals_replace_of_the_transformed_states(setup):
    adapter, items, fmt, site, after, X, z = setup
    eraser = LEACE().fit(X, z)
    live = _downstream(adapter, items, fmt, site, after, Apply(eraser))
    replaced = _downstream(adapter, items, fmt, site, after, Replace(eraser.transform(X)))
    torch.testing.assert_close(live, replaced, atol=1e-5, rtol=1e-5)
    untouched = _downstream(adapter, items, fmt, site, after, Replace(X))
    assert (live - untouched).abs().max() > 1e-3  # it edits something
    # the erased states themselves, read at the site after the edit
    read = adapter.map(items, fmt, read=[site], edits={site: Apply(eraser)}).acts[site]
    torch.testing.assert_close(read, eraser.transform(X), atol=1e-5, rtol=1e-5)


def test_a_counterfactual_intervention_takes_per_item_targets(setup):
    adapter, items, fmt, site, after, X, z = setup
    steer = MeanDiff().fit(X, z)
    goal = 1 - z
    live = _downstream(adapter, items, fmt, site, after, Apply(steer, goal))
    replaced = _downstream(adapter, items, fmt, site, after, Replace(steer.transform(X, goal)))
    torch.testing.assert_close(live, replaced, atol=1e-5, rtol=1e-5)


def test_a_function_is_applied_row_wise(setup):
    adapter, items, fmt, site, after, X, _ = setup
    shift = torch.linspace(-1, 1, X.shape[1])
    live = _downstream(adapter, items, fmt, site, after, Apply(lambda h: h + shift))
    torch.testing.assert_close(live, _downstream(adapter, items, fmt, site, after, Replace(X + shift)),
                               atol=1e-5, rtol=1e-5)


def test_apply_refuses_what_it_cannot_apply(setup):
    *_, X, z = setup
    with pytest.raises(NotFittedError, match="LEACE is not fitted"):
        Apply(LEACE())
    with pytest.raises(ConfigError, match="needs targets"):
        Apply(MeanDiff().fit(X, z))
    with pytest.raises(ConfigError, match="takes no targets"):
        Apply(LEACE().fit(X, z), z)
    with pytest.raises(ConfigError, match="fitted estimator"):
        Apply(3)


def test_a_gradient_attack_runs_live_in_an_inference_pass(setup):
    """FGSM differentiates its probe with respect to the states: applied inside a forward run under inference mode
    (a multi-site edit) it gives the states of Replace(transform(X)) (tolerance 1e-5, float32). FGSM, not PGD: PGD's
    random start depends on how the rows are batched."""
    from cprobe.interventions.fgsm import FGSM

    adapter, items, fmt, site, after, X, z = setup
    torch.manual_seed(0)
    probe = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    attack = FGSM.from_module(probe, 2, eps=0.5)
    goal = 1 - z
    live = _downstream(adapter, items, fmt, site, after, Apply(attack, goal))
    replaced = _downstream(adapter, items, fmt, site, after, Replace(attack.transform(X, goal)))
    torch.testing.assert_close(live, replaced, atol=1e-5, rtol=1e-5)
    assert (live - _downstream(adapter, items, fmt, site, after, Replace(X))).abs().max() > 1e-3
