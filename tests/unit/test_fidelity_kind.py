"""A kind decides by the instance (issue 30): a direction intervention's ``kind`` is a constructor setting, so every
check that reads a kind reads the built instance's, at validation, before any model loads."""

from __future__ import annotations

import pytest

from cprobe.config import parse
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from cprobe.tasks.reliability import Config, _validate_sites

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def test_the_class_default_and_the_instance_can_differ():
    cls = INTERVENTIONS.get("mean_direction")
    assert cls.kind == "counterfactual"
    assert INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}).kind == "nullifying"


def test_sequential_refitting_is_allowed_for_an_eraser_instance_and_refused_for_a_counterfactual_one():
    """``reliability.mode=sequential`` refits erasers site by site: a direction intervention built with ``kind:
    nullifying`` is one (its class default is counterfactual); built counterfactual it is refused, naming its kind."""
    rc = parse(Config, {"sites": [2, 3], "mode": "sequential"}, "reliability")
    _validate_sites(rc, INTERVENTIONS.build({"name": "mean_direction", "kind": "nullifying"}), None)
    with pytest.raises(ConfigError, match="is counterfactual: use mode=simultaneous"):
        _validate_sites(rc, INTERVENTIONS.build({"name": "mean_direction"}), None)


def test_causalgym_accepts_a_nullifying_direction_intervention_and_refuses_a_bad_kind_at_validation():
    from cprobe.tasks import causalgym as cg_task

    ok = cg_task.Config(methods=["mean_direction"], interventions={"mean_direction": {"kind": "nullifying"}})
    ok.resolve({"name": "toy"})
    bad = cg_task.Config(methods=["mean_direction"], interventions={"mean_direction": {"kind": "erasing"}})
    with pytest.raises(ConfigError, match=r"bad causalgym.interventions.mean_direction: .*kind must be") as e:
        bad.resolve({"name": "toy"})
    assert "\n" not in str(e.value)


def test_an_explainer_cannot_change_the_kind_its_removal_capability_was_declared_with():
    """``removal_only`` is read from the class before any model loads, so ``via_<direction>`` runs the class's kind;
    asking for another is refused at construction (validation), not run under the wrong label."""
    from cprobe.explainers.base import EXPLAINERS

    with pytest.raises(ConfigError, match="kind is the intervention's declared 'counterfactual'"):
        EXPLAINERS.build({"name": "via_mean_direction", "kind": "nullifying"})
    assert not EXPLAINERS.get("via_mean_direction").removal_only
    EXPLAINERS.build({"name": "via_mean_direction", "along": "covariance"})  # the edit's other settings pass through
