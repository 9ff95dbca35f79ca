"""The method vocabulary (``cprobe.methods``): what a study's method name is, read from the registries' declared
capabilities and bridges, answered in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from cprobe import methods as M
from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS

SRC = Path(__file__).resolve().parents[2] / "src" / "cprobe"


def test_which_registry_a_name_reads():
    assert not M.is_intervention("das") and M.family("das") == "direction"  # both know it: the direction
    assert M.is_intervention("leace") and M.family("leace") == "intervention"
    assert not M.is_intervention("nope") and M.registry("mean") is DIRECTIONS and M.registry("pgd") is INTERVENTIONS
    assert {"das", "vanilla", "leace", "autoattack", "probe_direction"} <= set(M.method_names())
    assert M.method_names() == sorted(set(DIRECTIONS.all_names()) | set(INTERVENTIONS.all_names()))
    assert M.provenance("mean").startswith("built-in")


def test_capabilities_are_read_from_the_class_of_the_registry_the_name_reads():
    assert M.declares("das", "causal") and not M.declares("mean", "causal")
    assert M.declares("random", "chance_baseline") and M.declares("probe", "per_model_lambda")
    assert M.declares("pgd", "needs_probe") and not M.declares("leace", "needs_probe")
    assert not M.declares("leace", "causal")  # an intervention declares no direction's capability


def test_the_bridge_of_a_direction_is_the_intervention_that_declares_it():
    assert M.bridge("probe") == "probe_direction" and M.bridge("mean") == "mean_direction"
    assert M.bridge("das") == "das"  # DAS's intervention keeps its name
    assert M.bridge("vanilla") is None and M.bridge("leace") is None  # no direction / not a direction method
    for name in INTERVENTIONS.names():
        d = getattr(INTERVENTIONS.get(name), "direction_name", "")
        if d:
            assert M.bridge(d) == name


@pytest.mark.parametrize("name, needs, start", [
    ("nope", M.Needs(), "unknown method 'nope' in L; choose from ["),
    ("pgd", M.Needs(direction=True), "intervention 'pgd' exposes no direction (exposes_direction is false); L scores a "
                                     "direction, so intervention 'pgd' cannot run in L: interventions that do: ["),
    ("vanilla", M.Needs(direction=True), "direction method 'vanilla' learns no direction (whole_vector); L scores a "
                                         "direction, so direction method 'vanilla' cannot run in L"),
    ("probe_direction", M.Needs(), None),
    ("das_direction_of_a_bridge", M.Needs(), "unknown method"),
])
def test_one_wording_per_capability(name, needs, start):
    why = M.refusal(name, "L", needs)
    assert why is None if start is None else why.startswith(start), why


def test_what_each_need_lets_through():
    assert M.refusal("pgd", "L") is None  # an edit without a direction runs where no direction is scored (CausalGym)
    assert M.refusal("vanilla", "L", M.Needs(direction=True, whole_vector=True)) is None  # RAVEL's whole-vector swap
    assert M.refusal("pgd", "L", M.Needs(direction=True, whole_vector=True)) is not None
    assert M.refusal("leace", "L", M.Needs(direction=True)) is None  # it exposes its direction


def test_an_intervention_trained_through_the_model_is_refused_everywhere_naming_its_direction(monkeypatch):
    class Through(INTERVENTIONS.get("probe_direction")):
        needs_model = True

    monkeypatch.setitem(INTERVENTIONS._items, "through", Through)
    why = M.refusal("through", "L")
    assert why.startswith("intervention 'through' trains through the model (needs_model); ") and why.endswith(
        "list its direction method instead (e.g. probe)")


def test_the_list_check_is_one_line_and_a_value_error_too():
    with pytest.raises(M.MethodError, match=r"^L is empty; choose from \["):
        M.check([], "L")
    with pytest.raises(ConfigError, match=r"^L lists a method twice: \['mean', 'mean'\]$"):
        M.check(["mean", "mean"], "L")
    with pytest.raises(ValueError, match="unknown method 'x' in L"):
        M.check(["mean", "x"], "L")
    M.check(["mean", "das", "leace", "pgd", "vanilla"], "L")


def test_draws_are_seeded_apart_by_a_prime_stride():
    assert M.DRAW_STRIDE == 7_919 and M.draw_seed(10, 0) == 10 and M.draw_seed(10, 3) == 10 + 3 * 7_919


def test_unit_directions_by_capability():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 6, generator=g)
    y = (X[:, 0] > 0).long()
    X[:, 0] += 3 * y  # the class lives on the first coordinate
    # a chance baseline: n draws, draw k seeded from the site's seed + k * stride (the job seed is not used)
    draws = M.unit_directions("random", {}, X, y, seed=1, n_draws=3, site_seed=50)
    assert len(draws) == 3
    for k, a in enumerate(draws):
        assert torch.equal(a, DIRECTIONS.build({"name": "random"}, seed=50 + 7_919 * k).fit(X).a)
    assert not torch.equal(draws[0], draws[1])
    assert torch.equal(M.unit_directions("random", {}, X, y, seed=50)[0], draws[0])  # no site seed: the job's
    # a fitted direction: one, whatever n_draws
    (mean,) = M.unit_directions("mean", {}, X, y, seed=0, n_draws=5, site_seed=9)
    want = X[y == 1].mean(0) - X[y == 0].mean(0)
    assert torch.allclose(mean / mean.norm(), want / want.norm(), atol=1e-5)
    # an intervention: the edit direction of the eraser fitted alike
    (a,) = M.unit_directions("leace", {}, X, y, seed=0)
    ref = INTERVENTIONS.build({"name": "leace"}, seed=0).fit(X, y).edit_direction()
    assert torch.allclose(a.abs(), ref.abs(), atol=1e-6)
    with pytest.raises(ValueError, match="not one direction"):
        M.unit_directions("inlp", {"rank": 2}, X, y, seed=0)


def test_the_fallback_direction_is_the_first_chance_baseline_drawn_at_the_seed():
    a = M.fallback_direction(7, seed=3)
    assert a.shape == (7,) and torch.isclose(a.norm(), torch.tensor(1.0))
    assert torch.equal(a, DIRECTIONS.build({"name": "random"}, seed=3).fit(torch.randn(5, 7)).a)
    assert not torch.equal(a, M.fallback_direction(7, seed=4))


def test_no_study_answers_the_vocabulary_itself():
    """Each answer exists once (issue 51): no module but ``methods`` defines the vocabulary's functions, seeds draws
    with the stride, looks a bridge up by ``direction_name`` or builds from the two registries by hand."""
    defined = {"is_intervention", "method_names", "build_intervention", "build_direction", "_fallback",
               "_fallback_direction", "method_of"}
    problems = []
    for f in sorted(SRC.rglob("*.py")):
        if f.name == "methods.py" and f.parent == SRC:
            continue
        text = f.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name in defined:
                problems.append(f"{f.relative_to(SRC)} defines {node.name}")
        if f.is_relative_to(SRC / "tasks") or f.name in ("yardsticks.py", "pipeline.py"):
            for needle in ("7_919", "7919", "DIRECTIONS.build(", "\"direction_name\"", "INTERVENTIONS if ",
                           "if is_intervention(m) else"):
                if needle in text:
                    problems.append(f"{f.relative_to(SRC)}: {needle}")
    assert not problems, problems


# ----------------------------------------------------------------------------------------------- as a featurizer
def _toy_states():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 6, generator=g)
    y = (X[:, 0] > 0).long()
    X[:, 0] += 3 * y  # the class lives on the first coordinate
    return X, y


def _toy_forward(X, y):
    """A causal method's fit arguments on the toy states: a linear readout of the first coordinate, the sources the
    rows of the other class."""
    W = torch.zeros(2, X.shape[1])
    W[1, 0] = 1.0

    def forward(edit, idx):
        return torch.log_softmax(edit(X[idx]) @ W.T, -1)

    return forward, X.flip(0), y.flip(0)


def test_a_fitted_method_as_a_featurizer_by_what_it_declares():
    from cprobe.directions.das import DAS
    from cprobe.models.featurizers import Identity, Subspace

    X, y = _toy_states()
    ident, plane = Identity(6), Subspace(torch.eye(6)[:, :2])
    assert M.featurizer(ident) is ident and M.featurizer(plane) is plane  # a featurizer is itself
    assert M.featurizer(DIRECTIONS.build({"name": "vanilla"}).fit(X, y)) is None  # the whole-vector swap
    mean = DIRECTIONS.build({"name": "mean"}).fit(X, y)
    f = M.featurizer(mean)
    assert isinstance(f, Subspace) and torch.equal(f.basis, mean.a[:, None])
    das = DAS(k=2)  # a k-dimensional basis, set by hand: every column kept
    das.basis_ = torch.eye(6)[:, [3, 1]]
    das.a = das.basis_[:, 0]
    assert torch.equal(M.featurizer(das).basis, torch.eye(6)[:, [3, 1]])
    leace = INTERVENTIONS.build({"name": "leace"}).fit(X, y)  # an eraser exposing its direction
    assert torch.equal(M.featurizer(leace).basis, leace.edit_direction()[:, None])
    bridged = INTERVENTIONS.build({"name": "mean_direction"}).fit(X, y)  # a direction as an intervention
    assert torch.allclose(M.featurizer(bridged).basis[:, 0], mean.a, atol=1e-6)
    with pytest.raises(ValueError, match="not one direction"):
        M.featurizer(INTERVENTIONS.build({"name": "inlp", "rank": 2}).fit(X, y))
    with pytest.raises(ValueError, match="no featurizer"):
        M.featurizer(INTERVENTIONS.build({"name": "pgd", "eps": 0.1}))


def test_every_direction_and_every_exposing_intervention_yields_a_featurizer():
    """By the registries: each direction method (a causal one trained through a toy readout) and each intervention
    that exposes its direction or bridges a direction method, fitted on a small binary toy, gives a one-feature
    subspace along its unit direction; the whole-vector swap gives None, a method that gives features (RAVEL's SAE
    method) itself, and a mask over a basis its selected features."""
    from cprobe.interventions import fit_intervention
    from cprobe.models.featurizers import Subspace
    from cprobe.tasks.causalgym_settings import DEFAULT_INTERVENTIONS  # the rank-1 settings

    X, y = _toy_states()
    for name in DIRECTIONS.names():
        cls = DIRECTIONS.get(name)
        m = M.build(name, {}, seed=0)
        m = m.fit(*_toy_forward(X, y)) if cls.causal else m.fit(X, y)
        f = M.featurizer(m)
        if cls.whole_vector:
            assert f is None, name
            continue
        if cls.features:  # a method that gives features is its own featurizer (RAVEL's SAE method)
            assert f is m and f.n_features == len(m.latents_), name  # its chosen latents (none where C keeps none)
            continue
        if cls.feature_mask:  # a mask over a basis (DBM): its selected features, no direction
            assert f is m.featurizer_ and 0 <= f.n_features <= X.shape[1], name
            continue
        assert isinstance(f, Subspace) and f.n_features == 1, name
        assert torch.allclose(f.basis[:, 0], m.a) and float(m.a.norm()) == pytest.approx(1.0, abs=1e-5), name
    for name in INTERVENTIONS.names():
        cls = INTERVENTIONS.get(name)
        if not (cls.exposes_direction or getattr(cls, "direction_name", "")) or cls.needs_model:
            continue
        params = DEFAULT_INTERVENTIONS.get(name, {})
        m = M.build(name, {**params, **({"max_steps": 100} if "max_steps" in params else {})}, seed=0)
        fit_intervention(m, X, y)
        f = M.featurizer(m)
        assert isinstance(f, Subspace) and f.n_features == 1, name
        assert float(f.basis.norm()) == pytest.approx(1.0, abs=1e-5), name


def test_a_study_reading_one_direction_refuses_a_k_dimensional_subspace():
    assert M.one_direction(M.build("das", {}, 0), "das", "x") is not None
    with pytest.raises(M.MethodError, match="k=2 learns a 2-dimensional subspace"):
        M.one_direction(M.build("das", {"k": 2}, 0), "das", "axbench.params.das")
    with pytest.raises(ConfigError, match="k=3"):  # the reliability study's DAS intervention edits one coordinate
        INTERVENTIONS.build({"name": "das", "k": 3})
