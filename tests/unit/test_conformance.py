"""Every built-in method passes cprobe's conformance checks (:mod:`cprobe.testing`, the checks ``cprobe check`` runs
on outside code): parametrised over the registries, so a newly registered built-in is checked without an entry here
(it needs one in ``SMALL`` only for required arguments or a budget small enough for a unit test). Also: the checks
fail, readably, on deliberately broken classes, expected failures are the caller's, and the three ways of running
them agree."""

from __future__ import annotations

import json

import pytest
import torch

from cprobe import testing
from cprobe.testing import SMALL_PROBE, Subject, parametrize_with_checks, run_checks, subjects

SAE_SMALL = {"d_sae": 16, "k": 4, "epochs": 30, "latents": 6, "select": "attribution"}
"""An SAE on the planted 8-d Gaussian property: one latent carries only part of it (docs/sae.md), six chosen by
attribution carry it (the direction checks: the sum of their decoder rows is the planted coordinate)."""
SAE_ONE = {"d_sae": 16, "k": 4, "epochs": 30}
"""The same SAE for AxBench's methods, which read one latent (``sae_axbench``) or every latent (``sae_diffmean``)."""
AXBENCH_ONE_LATENT = "one latent's decoder row carries part of the planted coordinate (|cos| 0.68, docs/sae.md)"
EXPECTED = {
    "sae_axbench": {"check_finds_planted_direction": f"{AXBENCH_ONE_LATENT}; its activation detects the class at "
                                                     "AUROC 0.96 (check_token_scores)"},
    "sae_axbench_direction": {"check_counterfactual_sets_target": AXBENCH_ONE_LATENT},
}
"""Expected failures of the built-ins, by name: what one SAE latent cannot carry (the caller declares them,
:mod:`cprobe.testing`)."""
SMALL = {  # required arguments, and budgets small enough for a unit test (rank 1: the erasers' directions are checked)
    ("intervention", "inlp"): {"rank": 1}, ("intervention", "alterrep"): {"rank": 1},
    ("intervention", "rlace"): {"rank": 1, "max_steps": 300, "lr": 0.05},
    ("intervention", "fgsm"): {"eps": 4.0, "probe": SMALL_PROBE},
    ("intervention", "pgd"): {"eps": 4.0, "steps": 10, "probe": SMALL_PROBE},
    ("intervention", "autoattack"): {"eps": 4.0, "n_queries": 50, "probe": SMALL_PROBE},
    ("intervention", "das"): {"epochs": 1, "batch_size": 16, "lr": 0.1},
    ("direction method", "das"): {"epochs": 1, "batch_size": 16, "lr": 0.1},
    ("intervention", "sae_latents"): SAE_SMALL,
    ("intervention", "sae_decoder_direction"): SAE_SMALL,
    ("direction method", "sae_decoder"): SAE_SMALL,
    ("explainer", "via_sae_latents"): SAE_SMALL,
    ("explainer", "via_sae_decoder_direction"): SAE_SMALL,
    **{(f, n): SAE_ONE for f, n in (("direction method", "sae_axbench"), ("intervention", "sae_axbench_direction"),
                                    ("explainer", "via_sae_axbench_direction"), ("direction method", "sae_diffmean"),
                                    ("intervention", "sae_diffmean_direction"),
                                    ("explainer", "via_sae_diffmean_direction"))},
    ("direction method", "sae_features"): {"d_sae": 16, "epochs": 30, "C": 0.1},  # RAVEL's: a ReLU SAE, L1-chosen
    ("probe", "linear"): {"lrs": (1e-1,), "epochs": 20},
    ("probe", "mlp"): {"lrs": (1e-2,), "epochs": 10, "widths": (16,), "n_layers": (1,)},
    ("explainer", "conceptshap"): {"epochs": 3, "hidden": 32},
    ("explainer", "via_inlp"): {"rank": 2}, ("explainer", "via_alterrep"): {"rank": 2},
    ("explainer", "via_rlace"): {"rank": 1, "max_steps": 50},
    ("explainer", "via_fgsm"): {"eps": 0.5, "probe": SMALL_PROBE},
    ("explainer", "via_pgd"): {"eps": 0.5, "steps": 5, "probe": SMALL_PROBE},
    ("explainer", "via_autoattack"): {"eps": 0.5, "n_queries": 20, "probe": SMALL_PROBE},
    ("explainer", "inlp"): {"iterations": 2, "head_epochs": 1},
}
FAMILIES = tuple(f for f in testing.FAMILIES if f != "dataset type")  # the method families


def builtins() -> list[Subject]:
    from cprobe.testing import registry_of

    out = []
    for family in FAMILIES:
        reg = registry_of(family)
        for name in reg.builtin_names():
            out += subjects(name, SMALL.get((family, name), {}), family)
    return out


BUILTINS = builtins()


def test_every_family_and_every_registered_name_is_checked():
    names = {(s.family, s.ref) for s in BUILTINS}
    for family in FAMILIES:
        from cprobe.testing import registry_of

        assert {(family, n) for n in registry_of(family).builtin_names()} <= names
    assert {("intervention", n) for n in ("leace", "rlace", "inlp", "das", "random_direction")} <= names
    assert ("explainer", "via_leace") in names and ("metric", "icace_error_l2") in names


@parametrize_with_checks(BUILTINS, expected_failures=lambda s: EXPECTED.get(s.ref, {}))
def test_builtin_conformance(subject, check):
    check(subject)


# ------------------------------------------------------------------------------------ broken classes
from cprobe.interventions.base import Intervention  # noqa: E402


class InPlaceEraser(Intervention):
    """Broken on purpose: zeroes the first coordinate of its input in place."""

    kind = "nullifying"

    def fit(self, X, z):
        return self

    def transform(self, X, z_target=None):
        X[:, 0] = 0.0
        return X


class WrongShapeEraser(Intervention):
    """Broken on purpose: drops the last coordinate."""

    kind = "nullifying"

    def fit(self, X, z):
        return self

    def transform(self, X, z_target=None):
        return X[:, :-1].clone()


class NaNSteer(Intervention):
    """Broken on purpose: counterfactual, returns NaNs, and ignores a missing target."""

    kind = "counterfactual"

    def fit(self, X, z):
        return self

    def transform(self, X, z_target=None):
        return torch.full_like(X, float("nan"))


def _status(results, check):
    return next(r for r in results if r.check == check)


def test_checks_fail_readably_on_broken_classes():
    inplace = run_checks(InPlaceEraser)
    r = _status(inplace, "check_no_inplace_edits")
    assert r.status == "failed" and "in place" in r.reason
    assert _status(inplace, "check_nullifying_erases").status == "passed"  # zeroing e0 erases: only the contract fails
    shape = run_checks(WrongShapeEraser)
    r = _status(shape, "check_transform_shape_dtype_device")
    assert r.status == "failed" and "came back (1000, 5)" in r.reason
    nan = run_checks(NaNSteer)
    assert _status(nan, "check_finite_output").status == "failed"
    assert _status(nan, "check_counterfactual_needs_target").status == "failed"
    assert _status(nan, "check_counterfactual_sets_target").status == "failed"
    assert all(x.status in ("passed", "skipped", "failed") and "\n" not in x.reason for x in inplace + shape + nan)


def test_the_semantic_checks_follow_the_configured_kind_not_the_class_default():
    # a direction as a nullifying intervention: judged as an eraser (the class default is counterfactual)
    null = run_checks("mean_direction", {"kind": "nullifying"}, family="intervention")
    assert _status(null, "check_nullifying_erases").status == "passed"
    assert _status(null, "check_counterfactual_sets_target").status == "skipped"
    plain = run_checks("mean_direction", family="intervention")
    assert _status(plain, "check_nullifying_erases").status == "skipped"
    assert _status(plain, "check_counterfactual_sets_target").status == "passed"


def test_expected_failures_are_declared_by_the_caller():
    results = run_checks(WrongShapeEraser, expected_failures={"check_transform_shape_dtype_device": "known: drops a dim"})
    r = _status(results, "check_transform_shape_dtype_device")
    assert r.status == "xfail" and r.reason.startswith("known: drops a dim")
    ok = run_checks("leace", family="intervention", expected_failures={"check_intervenes": "not really"})
    assert _status(ok, "check_intervenes").status == "xpass"
    strict = run_checks("leace", family="intervention", expected_failures={"check_intervenes": "x"}, strict=True)
    assert _status(strict, "check_intervenes").status == "failed"


def test_the_cli_prints_a_table_and_fails_on_a_broken_class():
    from typer.testing import CliRunner

    from cprobe.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["check", "tests.unit.test_conformance:InPlaceEraser"])
    assert r.exit_code == 1, r.output
    line = next(x for x in r.output.splitlines() if "check_no_inplace_edits" in x)
    assert "failed" in line and "in place" in line and "Traceback" not in r.output
    r = runner.invoke(app, ["check", "tests.unit.test_conformance:WrongShapeEraser", "--json",
                            "--xfail", "check_transform_shape_dtype_device=drops a dim",
                            "--xfail", "check_intervenes=drops a dim"])
    got = {x["check"]: x["status"] for x in json.loads(r.output)}
    assert got["check_transform_shape_dtype_device"] == "xfail"
    r = runner.invoke(app, ["check", "mean_diff", "alpha=1.0", "--family", "intervention"])
    assert r.exit_code == 0 and "mean_diff(alpha=1.0)" in r.output and " failed" not in r.output, r.output
    r = runner.invoke(app, ["check", "mean_diff", "alpha=0.5", "--family", "intervention"])  # moves halfway only
    assert r.exit_code == 1 and "check_counterfactual_sets_target" in r.output.split("failed")[0].splitlines()[-1]


class NeedsK(InPlaceEraser):
    def __init__(self, k: int, *, scale: float) -> None:
        self.k, self.scale = k, scale


def test_a_method_missing_required_settings_fails_once_naming_them():
    for target, names in [("rlace", ["rank"]), ("via_pgd", ["eps"]), (NeedsK, ["k", "scale"])]:
        results = run_checks(target)
        assert [(r.check, r.status) for r in results] == [("check_settings", "failed")], target
        reason = results[0].reason
        ref = target if isinstance(target, str) else "tests.unit.test_conformance:NeedsK"
        assert f"needs {' and '.join(names)}; give them: cprobe check {ref} " in reason, reason
        assert all(f"{n}=VALUE" in reason for n in names)
    both = run_checks("inlp")  # an intervention (needs rank) and an explainer (does not): only the first is stopped
    assert [r.check for r in both if r.family == "intervention"] == ["check_settings"]
    assert {r.status for r in both if r.family == "explainer"} <= {"passed", "skipped"}
    assert {r.status for r in run_checks("rlace", {"rank": 1, "max_steps": 50})} <= {"passed", "skipped", "failed"}
    assert "check_settings" not in {r.check for r in run_checks("rlace", {"rank": 1, "max_steps": 50})}


def test_pytest_ids_name_the_method_and_the_check():
    mark = parametrize_with_checks([("leace", {})])
    ids = [p.id for p in mark.args[1]]
    assert "leace-check_nullifying_erases" in ids and "leace-check_explains_every_query" in ids


@pytest.mark.numeric
def test_streaming_update_equals_one_fit_and_follows_later_batches():
    """update() over batches (uneven, one missing a class) gives the eraser/steerer of one fit on all rows, and more
    data after use updates every public attribute."""
    from cprobe.errors import NotFittedError
    from cprobe.interventions import INTERVENTIONS
    from cprobe.testing import planted

    for name in ("leace", "mean_diff"):
        X, z = planted(n=300)
        X = X * torch.linspace(0.5, 3.0, X.shape[1]) + 4.0
        full = INTERVENTIONS.build({"name": name}).fit(X, z)
        stream = INTERVENTIONS.build({"name": name})
        for chunk in torch.split(torch.argsort(z, stable=True), [50, 37, 113, 100]):
            stream.update(X[chunk], z[chunk])
        if name == "leace":
            torch.testing.assert_close(stream.P, full.P, atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(stream.means, full.means)
        stream.update(X[:60] * 3.0, z[:60])
        again = INTERVENTIONS.build({"name": name}).fit(torch.cat([X, X[:60] * 3.0]), torch.cat([z, z[:60]]))
        if name == "leace":
            torch.testing.assert_close(stream.P, again.P, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(stream.bias, again.bias, atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(stream.means, again.means)
        with pytest.raises(NotFittedError):
            INTERVENTIONS.build({"name": name}).P if name == "leace" else \
                INTERVENTIONS.build({"name": name}).nearest_class(X)
