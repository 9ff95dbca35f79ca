"""The estimator base shared by the four method families (cprobe.estimator): fitted flag, not-fitted error and
capabilities in one place; one class per name (one ``Probe``, one ``LogisticDirection``); one task accuracy."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from cprobe.directions import DIRECTIONS
from cprobe.directions.base import Direction
from cprobe.errors import NotFittedError
from cprobe.estimator import Estimator
from cprobe.explainers import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries
from cprobe.interventions import INTERVENTIONS
from cprobe.interventions.base import Intervention
from cprobe.probes import PROBES
from cprobe.probes.base import Probe
from tests.conftest import REPO

SRC = REPO / "src" / "cprobe"
FAMILIES = {"probes": (Probe, PROBES), "interventions": (Intervention, INTERVENTIONS),
            "directions": (Direction, DIRECTIONS), "explainers": (Explainer, EXPLAINERS)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_shares_the_one_base_and_declares_its_capabilities(family):
    base, registry = FAMILIES[family]
    assert issubclass(base, Estimator)
    tree = ast.parse((SRC / family / "base.py").read_text())
    own = {n.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in c.body
           if isinstance(n, ast.FunctionDef)}
    assert not own & {"__init_subclass__", "__getattr__"}, "the fitted-state plumbing lives in cprobe.estimator"
    for name in registry.names():
        cls = registry.get(name)
        caps = cls.capabilities()
        assert set(caps) == set(base.CAPABILITIES)
        assert all(getattr(cls, c) == v for c, v in caps.items())


def test_a_new_subclass_gets_the_fitted_flag_and_the_error_for_free():
    class Scale(Intervention):
        kind = "nullifying"

        def fit(self, X, z):
            self.s_ = float(X.std())
            return self

        def transform(self, X, z_target=None):
            return X / self.s_

    est = Scale()
    assert not est.fitted_
    with pytest.raises(NotFittedError, match=r"Scale is not fitted yet: call fit\(X, z\) first"):
        est.transform(torch.ones(2, 2))
    assert est.fit(torch.randn(5, 2), torch.zeros(5)) is est and est.fitted_
    assert est.transform(torch.ones(2, 2)).shape == (2, 2)

    class Const(Direction):
        def fit(self, X, y):
            self.a = torch.ones(X.shape[1]) / X.shape[1] ** 0.5
            return self

    d = Const()
    with pytest.raises(NotFittedError, match="Const is not fitted yet"):
        d.a  # noqa: B018
    assert isinstance(d.fit(torch.zeros(3, 4), torch.zeros(3)).a, torch.Tensor) and d.fitted_
    with pytest.raises(AttributeError, match="has no attribute 'b'"):
        d.b  # noqa: B018  (only fitted attributes raise NotFittedError)


def test_probes_loaded_from_disk_count_as_fitted(tmp_path):
    from cprobe.probes.grid import load_probe, save_probe

    X, y = torch.randn(60, 4), torch.arange(60) % 2
    probe = PROBES.build({"name": "linear", "lrs": (0.1,), "epochs": 5}, seed=0).fit(X, y)
    save_probe(probe, tmp_path / "p.safetensors")
    fresh = PROBES.build({"name": "linear", "lrs": (0.1,), "epochs": 5}, seed=0)
    with pytest.raises(NotFittedError, match=r"call fit\(X, y\) first"):
        fresh.predict(X)
    loaded = load_probe(fresh, tmp_path / "p.safetensors")
    assert loaded.fitted_
    torch.testing.assert_close(loaded.predict_proba(X), probe.predict_proba(X))


def test_an_explainer_checks_fitted_state_inputs_and_output_shape():
    class Bad(Explainer):
        name = "bad"
        needs_representation = True

        def fit(self, model, train):
            return self

        def explain(self, queries):
            return np.zeros((len(queries), 1))

    model = ExplainedModel(torch.nn.Linear(2, 3), 3, ("a",), ("x", "y"))
    obs = Observed(["t1", "t2"], np.full((2, 3), 1 / 3), reps=torch.zeros(2, 2))
    q = Queries(obs, ["a", "a"], ["x", "x"], ["y", "y"])
    with pytest.raises(NotFittedError, match=r"Bad is not fitted yet: call fit\(model, train\) first"):
        Bad().explain(q)
    from cprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="needs the representation"):
        Bad().fit(model, Observed(["t"], np.full((1, 3), 1 / 3)))
    ex = Bad().fit(model, obs)
    assert ex.fitted_ and ex.n_classes_ == 3
    with pytest.raises(AssertionError, match=r"returned \(2, 1\), expected \(2, 3\)"):
        ex.explain(q)


def test_one_class_per_name_across_the_method_families():
    names: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                names.setdefault(node.name, []).append(str(f.relative_to(SRC)))
    assert names["Probe"] == ["probes/base.py"]
    assert names["LogisticDirection"] == ["directions/probe.py"]
    assert DIRECTIONS.get("probe").__name__ == "LogisticDirection"


def test_one_task_accuracy():
    from cprobe import extract
    from cprobe.metrics import odds
    from cprobe.models import readouts

    assert extract.task_accuracy is readouts.task_accuracy
    scores = torch.tensor([[0.0, -1.0], [-1.0, 0.0], [0.5, 0.5], [2.0, 1.0]])
    assert readouts.task_accuracy(scores) == 0.5  # a tie is wrong
    assert odds.task_accuracy(scores[:, 0], scores[:, 1]) == 0.5
    assert readouts.CandidateTokens(torch.zeros(4, 2, dtype=torch.long)).accuracy(scores) == 0.5
    three = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 2.0]])  # the correct candidate must beat every other
    assert readouts.task_accuracy(three) == 0.5 and readouts.task_accuracy(None) is None
