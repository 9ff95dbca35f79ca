"""Outside code wherever a built-in name is accepted: import paths, installed plugins (entry points), the config's
``plugins:`` modules; refusals (dangerous targets, wrong family, contradictory capabilities, name clashes, broken
plugins) as one-line errors; provenance in records and the leaderboard; the studies' validation of outside methods
(in process: ``pipeline.prepare`` on composed configs)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.registry import Provenance, refresh_plugins
from tests.conftest import REPO

EXAMPLE_SRC = REPO / "examples" / "cprobe-plugin-example" / "src"


# ----------------------------------------------------------------------------------------------- helpers
@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """Write modules (and fake installed distributions) under tmp_path and put it on sys.path; undone after."""
    written: list[str] = []

    def write(modules: dict[str, str] | None = None, dists: dict[str, dict] | None = None) -> Path:
        for mod, src in (modules or {}).items():
            f = tmp_path.joinpath(*mod.split(".")).with_suffix(".py")
            f.parent.mkdir(parents=True, exist_ok=True)
            for parent in list(f.parents)[: len(mod.split(".")) - 1]:
                (parent / "__init__.py").touch()
            f.write_text(textwrap.dedent(src))
            written.append(mod)
        for dist, spec in (dists or {}).items():
            info = tmp_path / f"{dist.replace('-', '_')}-{spec.get('version', '1.0')}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {spec.get('version', '1.0')}\n")
            (info / "entry_points.txt").write_text("".join(
                f"[{g}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) for g, eps in spec["eps"].items()))
            (info / "top_level.txt").write_text("\n".join(spec.get("top", [])) + "\n")
        return tmp_path

    monkeypatch.syspath_prepend(str(tmp_path))
    refresh_plugins()
    yield write
    for mod in written:
        for name in [m for m in sys.modules if m == mod or m.startswith(mod.split(".")[0] + ".") or
                     m == mod.split(".")[0]]:
            sys.modules.pop(name, None)
    sys.path[:] = [p for p in sys.path if p != str(tmp_path)]
    refresh_plugins()


@pytest.fixture
def registered():
    """Names registered during a test are removed after it (the registries are process-wide)."""
    from cprobe.registry import LOADED_MODULES, REGISTRIES
    from cprobe.testing import registry_of

    registry_of("intervention")
    before = {g: set(r._items) for g, r in REGISTRIES.items()}
    yield
    for g, r in REGISTRIES.items():
        for name in set(r._items) - before[g]:
            r._items.pop(name, None)
            r._sources.pop(name, None)
        r._resolved.clear()
    LOADED_MODULES.clear()


ERASER = """
    import torch
    from cprobe.plugin import Intervention, register

    @register("{name}")
    class Eraser(Intervention):
        kind = "nullifying"
        def __init__(self, k: int = 1):
            self.k = k
        def fit(self, X, z):
            self.u_ = (X[z == 1].mean(0) - X[z == 0].mean(0)); self.u_ = self.u_ / self.u_.norm()
            return self
        def transform(self, X, z_target=None):
            u = self.u_.to(X.dtype)
            return X - (X @ u)[:, None] * u
"""


# ----------------------------------------------------------------------------------------------- import paths
def test_an_import_path_names_an_outside_class_with_its_keys_checked():
    import cprobe.data.registry  # noqa: F401  (the dataset family: the error names it)
    from cprobe.interventions import INTERVENTIONS

    path = "cprobe.testing:PlantedAgreement"
    with pytest.raises(ConfigError, match="is a dataset type, not an intervention"):
        INTERVENTIONS.get(path)
    sys.path.insert(0, str(EXAMPLE_SRC))
    try:
        m = INTERVENTIONS.build({"name": "cprobe_plugin_example.eraser:SpectralEraser", "k": 2})
        assert m.k == 2 and type(m).__name__ == "SpectralEraser"
        src = INTERVENTIONS.provenance("cprobe_plugin_example.eraser:SpectralEraser")
        assert src.kind == "import path" and src.target == "cprobe_plugin_example.eraser:SpectralEraser"
        with pytest.raises(ConfigError, match=r"unknown key\(s\) \['rank'\] .* valid: \['k', 'tol'\]"):
            INTERVENTIONS.build({"name": "cprobe_plugin_example.eraser:SpectralEraser", "rank": 2})
        with pytest.raises(ConfigError, match="k must be an integer"):
            INTERVENTIONS.build({"name": "cprobe_plugin_example.eraser:SpectralEraser", "k": 0})
    finally:
        sys.path.remove(str(EXAMPLE_SRC))


@pytest.mark.parametrize(("path", "message"), [
    ("os:system", "refusing to import 'os'"),
    ("builtins:eval", "refusing to import 'builtins'"),
    ("subprocess:Popen", "refusing to import 'subprocess'"),
    ("importlib.util:spec_from_file_location", "refusing to import 'importlib.util'"),
    ("antigravity:fly", "refusing to import 'antigravity'"),
    ("cprobe.interventions.leace:__class__", "dunder"),
    ("cprobe.interventions.leace:", "not an import path"),
    ("cprob.interventions.leace:LEACE", "no module named 'cprob'.*did you mean 'cprobe'"),
    ("cprobe.interventions.leace:LEACe", "has no attribute 'LEACe' \\(did you mean 'LEACE'\\?\\)"),
    ("cprobe.probes.linear:LinearProbe", "is a probe, not an intervention"),
    ("cprobe.interventions.base:check_batch", "is not a class, not an intervention"),
    ("cprobe.interventions.base:Intervention", "is abstract"),
    ("cprobe.directions.vanilla:Vanilla", "whole-vector swap"),
])
def test_bad_import_paths_are_one_line_errors(path, message):
    from cprobe.interventions import INTERVENTIONS

    with pytest.raises(ConfigError, match=message) as e:
        INTERVENTIONS.get(path)
    assert "\n" not in str(e.value)


def test_unknown_names_suggest_close_ones():
    from cprobe.interventions import INTERVENTIONS

    with pytest.raises(ConfigError, match="unknown intervention 'leac'; did you mean 'leace'"):
        INTERVENTIONS.get("leac")


def test_a_direction_named_where_an_intervention_is_expected_runs_as_one():
    from cprobe.explainers import EXPLAINERS
    from cprobe.interventions import INTERVENTIONS

    m = INTERVENTIONS.build({"name": "cprobe.directions.lda:LDA", "kind": "nullifying"})
    assert m.direction_name == "cprobe.directions.lda:LDA" and m.kind == "nullifying"
    via = EXPLAINERS.get("via_cprobe.directions.lda:LDA")
    assert via.intervention == "cprobe.directions.lda:LDA" and not via.removal_only
    with pytest.raises(ConfigError, match="declares needs_model"):
        EXPLAINERS.get("via_das")


def test_contradictory_capabilities_are_refused(on_path):
    from cprobe.interventions import INTERVENTIONS

    on_path({"bad_caps": """
        from cprobe.plugin import Intervention, Direction
        class Sideways(Intervention):
            kind = "sideways"
            def fit(self, X, z): return self
            def transform(self, X, z_target=None): return X
        class Exposes(Intervention):
            kind = "nullifying"
            exposes_direction = True
            def fit(self, X, z): return self
            def transform(self, X, z_target=None): return X
        class Attacks(Intervention):
            kind = "counterfactual"
            needs_probe = True
            def fit(self, X, z): return self
            def transform(self, X, z_target=None): return X
        class Swap(Direction):
            whole_vector = True
            supervised = True
            def fit(self, X, y): return self
    """})
    for cls, msg in (("Sideways", "kind must be one of"), ("Exposes", "edit_direction\\(\\) is not implemented"),
                     ("Attacks", "no use_probe")):
        with pytest.raises(ConfigError, match=f"contradictory capabilities: .*{msg}"):
            INTERVENTIONS.get(f"bad_caps:{cls}")
    from cprobe.directions import DIRECTIONS

    with pytest.raises(ConfigError, match="whole_vector .* contradicts \\['supervised'\\]"):
        DIRECTIONS.get("bad_caps:Swap")


def test_a_duck_typed_class_is_used_as_its_family(on_path, caplog):
    from cprobe.errors import NotFittedError
    from cprobe.interventions import INTERVENTIONS

    on_path({"ducks": """
        class Shift:
            kind = "counterfactual"
            def fit(self, X, z):
                self.d_ = X[z == 1].mean(0) - X[z == 0].mean(0)
                return self
            def transform(self, X, z_target=None):
                return X + (2 * z_target[:, None] - 1) * self.d_ / 2
    """})
    m = INTERVENTIONS.build({"name": "ducks:Shift"})
    with pytest.raises(NotFittedError):
        m.transform(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    X, z = torch.randn(20, 3), torch.arange(20) % 2
    assert m.fit(X, z) is m and m.transform(X, 1 - z).shape == X.shape
    assert "does not subclass cprobe.plugin.Intervention" in caplog.text


# ----------------------------------------------------------------------------------------------- plugins: modules
def test_a_config_module_registers_names_used_like_built_ins(on_path, registered, tmp_path, monkeypatch):
    from cprobe.interventions import INTERVENTIONS
    from cprobe.registry import load_plugin_modules

    on_path({"my_lab.methods": ERASER.format(name="mine")})
    (loaded,) = load_plugin_modules(["my_lab.methods"])
    assert loaded.names == [("intervention", "mine")]
    assert INTERVENTIONS.build({"name": "mine", "k": 3}).k == 3
    src = INTERVENTIONS.provenance("mine")
    assert src.kind == "plugins module" and src.target == "my_lab.methods:Eraser" and src.text == src.target


def test_config_modules_never_shadow_built_ins_nor_each_other(on_path, registered):
    from cprobe.registry import load_plugin_modules

    on_path({"lab_a.m": ERASER.format(name="shared"), "lab_b.m": ERASER.format(name="shared"),
             "lab_c.m": ERASER.format(name="leace"), "lab_d.m": "raise RuntimeError('boom at import')"})
    load_plugin_modules(["lab_a.m"])
    with pytest.raises(ConfigError, match="intervention 'shared' is claimed twice: by lab_a.m:Eraser and by "
                                          "lab_b.m:Eraser"):
        load_plugin_modules(["lab_b.m"])
    with pytest.raises(ConfigError, match="registers intervention 'leace', a built-in name"):
        load_plugin_modules(["lab_c.m"])
    with pytest.raises(ConfigError, match="plugins\\[0\\]: importing 'lab_d.m' raised RuntimeError: boom at import"):
        load_plugin_modules(["lab_d.m"])
    for bad, msg in ((["os"], "refusing to import 'os'"), ("my_lab", "must be a list"),
                     (["a.b:C"], "list modules here"), (["no_such_lab.x"], "no module named 'no_such_lab'")):
        with pytest.raises(ConfigError, match=msg):
            load_plugin_modules(bad)


# ----------------------------------------------------------------------------------------------- entry points
def _dists(on_path):
    return on_path(
        {"goodpkg.erasers": ERASER.replace('@register("{name}")', ""),
         "brokenpkg.erasers": "raise ImportError('needs a library that is not installed')",
         "clash_a.m": ERASER.replace('@register("{name}")', ""),
         "clash_b.m": ERASER.replace('@register("{name}")', "")},
        {"goodpkg": {"version": "2.1", "eps": {"cprobe.interventions": {"good": "goodpkg.erasers:Eraser"}},
                     "top": ["goodpkg"]},
         "brokenpkg": {"eps": {"cprobe.interventions": {"broken": "brokenpkg.erasers:Eraser"}}},
         "clash-a": {"eps": {"cprobe.interventions": {"twice": "clash_a.m:Eraser"}}},
         "clash-b": {"eps": {"cprobe.interventions": {"twice": "clash_b.m:Eraser"}}},
         "shadowpkg": {"eps": {"cprobe.interventions": {"leace": "goodpkg.erasers:Eraser"}}}})


def test_installed_plugins_load_lazily_and_a_broken_one_breaks_only_its_own_use(on_path, registered):
    from cprobe.interventions import INTERVENTIONS

    _dists(on_path)
    assert {"good", "broken", "twice"} <= set(INTERVENTIONS.plugin_names())
    assert "leace" not in INTERVENTIONS.plugin_names()  # a plugin never shadows a built-in
    assert "goodpkg.erasers" not in sys.modules and "brokenpkg.erasers" not in sys.modules  # nothing imported yet
    m = INTERVENTIONS.build({"name": "good", "k": 2})
    assert m.k == 2 and INTERVENTIONS.provenance("good") == Provenance("entry point", "goodpkg.erasers:Eraser",
                                                                       "goodpkg", "2.1")
    assert INTERVENTIONS.provenance("good").text == "goodpkg 2.1"
    assert type(INTERVENTIONS.build({"name": "leace"})).__module__ == "cprobe.interventions.leace"
    with pytest.raises(ConfigError, match="plugin intervention 'broken' \\(package brokenpkg 1.0, brokenpkg.erasers:"
                                          "Eraser\\) does not import: ImportError: needs a library"):
        INTERVENTIONS.get("broken")
    with pytest.raises(ConfigError, match="claimed by several installed plugins: clash-a 1.0 and clash-b 1.0"):
        INTERVENTIONS.get("twice")
    assert INTERVENTIONS.get("good") is type(m)  # the broken and the clashing ones did not break it


def test_cprobe_plugins_and_list_show_each_plugin_with_its_health(on_path, registered, monkeypatch):
    from typer.testing import CliRunner

    from cprobe.cli import app

    _dists(on_path)
    out = CliRunner().invoke(app, ["plugins"])
    assert out.exit_code == 1, out.output  # a plugin that cannot be used is a failure of the listing
    rows = {line.split()[1]: line for line in out.output.splitlines()[2:]}
    assert rows["good"].split()[2:4] == ["goodpkg", "2.1"] and rows["good"].endswith("ok")
    assert "error: plugin intervention 'broken'" in rows["broken"] and "does not import" in rows["broken"]
    assert "claimed by several packages" in rows["twice"]
    assert "ignored: shadows a built-in name" in rows["leace"]
    listing = CliRunner().invoke(app, ["list", "intervention"]).output
    assert "good " in listing and "plugin (goodpkg 2.1): intervention=custom intervention.name=good" in listing
    monkeypatch.setenv("CPROBE_NO_PLUGINS", "1")
    assert "good " not in CliRunner().invoke(app, ["list", "intervention"]).output


# ----------------------------------------------------------------------------------------------- the studies
def _prepare(*overrides: str):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe._hydra import normalise
    from cprobe.pipeline import prepare

    argv, _ = normalise(list(overrides), resolve=False)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=argv)
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    return prepare(plain, overrides=[a for a in argv if not a.startswith("+experiment")])


def test_studies_validate_outside_methods_by_their_declared_capabilities(on_path, registered):
    on_path({"lab_caps": """
        from cprobe.plugin import Intervention
        class Steer(Intervention):
            kind = "counterfactual"
            def fit(self, X, z): return self
            def transform(self, X, z_target=None): return X
        class Trained(Intervention):
            kind = "counterfactual"
            needs_model = True
            def fit(self, X, z, through=None): return self
            def transform(self, X, z_target=None): return X
    """})
    job = _prepare("+experiment=sva_tiny_reliability", "intervention=custom", "intervention.name=lab_caps:Steer")
    assert job.keys.intervention["name"] == "lab_caps:Steer"
    with pytest.raises(ConfigError, match="mode=sequential refits an eraser .* Steer is counterfactual"):
        _prepare("+experiment=sva_tiny_reliability", "intervention=custom", "intervention.name=lab_caps:Steer",
                 "reliability.mode=sequential", "reliability.sites=[2,3]")
    with pytest.raises(ConfigError, match="needs_model"):
        _prepare("+experiment=causalgym", "causalgym.methods=[mean,lab_caps:Trained]")
    _prepare("+experiment=causalgym", "causalgym.methods=[mean,lab_caps:Steer]")
    with pytest.raises(ConfigError, match="needs a 'name'"):
        _prepare("+experiment=sva_tiny_reliability", "intervention=custom")
    with pytest.raises(ConfigError, match="no module named 'lab_nope'"):
        _prepare("+experiment=sva_tiny_reliability", "intervention=custom", "intervention.name=lab_nope:X")


@pytest.fixture
def metrics_restored():
    """Outside metrics registered during a test are removed after it (METRICS is process-wide: the built-in metric
    documentation tests read it)."""
    from cprobe.metrics.registry import METRICS

    before = dict(METRICS)
    yield
    METRICS.clear()
    METRICS.update(before)


def test_metrics_are_refused_where_the_study_lacks_their_inputs(metrics_restored):
    sys.path.insert(0, str(EXAMPLE_SRC))
    try:
        job = _prepare("+experiment=sva_tiny_reliability", "metrics=[cprobe_plugin_example.metric:EDIT_NORM]")
        assert job.keys.metrics == ["cprobe_plugin_example.metric:EDIT_NORM"]
        with pytest.raises(ConfigError, match="reads 'edit' inputs, which task 'cebab' does not compute .*"
                                              "reliability"):
            _prepare("+experiment=cebab", "metrics=[cprobe_plugin_example.metric:EDIT_NORM]")
        with pytest.raises(ConfigError, match="is a built-in metric"):
            _prepare("+experiment=sva_tiny_reliability", "metrics=[reliability]")
    finally:
        sys.path.remove(str(EXAMPLE_SRC))


def test_empty_plugin_keys_leave_every_config_id_as_it_was():
    from cprobe.job import config_hash
    from cprobe.records import config_id

    cfg = {"task": "reliability", "seed": 0, "model": {"name": "m"}}
    assert config_id({**cfg, "plugins": [], "metrics": []}) == config_id(cfg)
    assert config_hash({**cfg, "plugins": [], "metrics": []}) == config_hash(cfg)
    assert config_id({**cfg, "metrics": ["x"]}) != config_id(cfg)


# ----------------------------------------------------------------------------------------------- provenance
def test_records_and_the_leaderboard_name_where_each_method_came_from():
    from cprobe import records as R
    from cprobe.leaderboard import leaderboard, markdown
    from cprobe.registry import PLUGIN_API_VERSION
    from cprobe.tasks.reliability import RECORDS

    table = pd.DataFrame({"model": ["m", "m"], "dataset": ["d", "d"], "layer": [2, 2], "position": ["target"] * 2,
                          "method": ["leace", "spectral"], "kind": ["nullifying"] * 2, "hparam": [None, None],
                          "hparam_value": [None, None], "completeness": [0.9, 0.8], "selectivity": [0.9, 0.9],
                          "reliability": [0.9, 0.85], "oracle_probe": ["mlp"] * 2, "n_scored": [10, 10],
                          "metric_edit_norm": [float("nan"), 0.5]})
    sources = R.method_sources(table, RECORDS, ["built-in", "lab 0.1"])
    recs = R.to_records(table, RECORDS, "reliability", 0, "cid", sources)
    assert set(zip(recs["method"], recs["source"])) == {("leace", "built-in"), ("spectral", "lab 0.1")}
    assert (recs["plugin_api"] == PLUGIN_API_VERSION).all() and list(recs.columns) == list(R.COLUMNS)
    back = R.from_records(recs, RECORDS)
    assert "metric_edit_norm" in back and "source" not in back
    board = leaderboard(recs)
    assert set(zip(board["method"], board["source"])) == {("leace", "built-in"), ("spectral", "lab 0.1")}
    assert "| source" in markdown(board).replace("  ", " ") or " source " in markdown(board)
    builtin_only = leaderboard(recs[recs["method"] == "leace"])
    assert "source" not in markdown(builtin_only).split("## ")[1].splitlines()[2]  # all built-in: column left out
