"""Downstream read layers and multi-site edits (issue 22 items 4–5): the edited pass read at every l′ ≥ l, the site and
read-layer specs, simultaneous vs sequential fitting, the l × l′ report. Tiny random models; no download."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch

from cprobe.config import parse
from cprobe.data.items import TextItem
from cprobe.errors import ConfigError
from cprobe.interventions.inlp import INLP
from cprobe.interventions.leace import LEACE
from cprobe.interventions.mean_diff import MeanDiff
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply, Replace
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.sites import Site
from cprobe.tasks.reliability import (
    Config,
    EditSite,
    _validate_sites,
    edit_sites,
    read_layer_heatmap,
    read_layer_table,
    read_layers,
    report,
)
from cprobe.tasks.sites import fit_sites
from tests.conftest import WORDS, make_random_model


def _setup(arch: str):
    model, tok = make_random_model(arch)
    adapter = (ModelAdapter(model.transformer, tok, "encoder", "tiny-gpt2", batch_size=8) if arch == "gpt2"
               else ModelAdapter(model, tok, "mlm", "tiny-bert", batch_size=8))
    rng = random.Random(0)
    items = [TextItem(str(i), " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))) for i in range(48)]
    return adapter, items, ClassificationFormatter(32)


@pytest.fixture(scope="module", params=["gpt2", "bert"])
def setup(request):
    return _setup(request.param)


def test_an_identity_edit_at_l_reproduces_the_unedited_states_at_every_read_layer(setup):
    """Tolerance 0: in float32 the identity edit (and Replace by the states read unedited) is bit-exact at every
    l′ ≥ l — the edit writes back exactly what was there, and the rest of the pass is the same computation."""
    adapter, items, fmt = setup
    L = adapter.n_layers
    reads = [Site(k, "last") for k in range(L + 1)]
    clean = adapter.map(items, fmt, read=reads).acts
    for l in range(L + 1):
        for spec in (Apply(lambda h: h), Replace(clean[Site(l, "last")])):
            out = adapter.map(items, fmt, read=reads[l:], edits={Site(l, "last"): spec}).acts
            for s in reads[l:]:
                assert torch.equal(out[s], clean[s]), (l, s)


def test_an_edit_at_l_moves_every_later_layer_and_no_earlier_one(setup):
    """The test above is not vacuous: a real edit at l changes the states read at every l′ > l in the same pass."""
    adapter, items, fmt = setup
    L = adapter.n_layers
    reads = [Site(k, "last") for k in range(L + 1)]
    clean = adapter.map(items, fmt, read=reads).acts
    shift = torch.linspace(-1, 1, adapter.hidden_size)
    out = adapter.map(items, fmt, read=reads, edits={Site(1, "last"): Apply(lambda h: h + shift)}).acts
    assert torch.equal(out[reads[0]], clean[reads[0]])
    for s in reads[1:]:
        assert (out[s] - clean[s]).abs().max() > 1e-3, s


def _class_gap(X: torch.Tensor, z: torch.Tensor) -> float:
    return (X[z == 0].mean(0) - X[z == 1].mean(0)).abs().max().item()


@pytest.mark.numeric
def test_sequential_refit_sees_the_upstream_edit_and_simultaneous_does_not():
    """LEACE at layers 1 and 2. Sequential: the layer-2 eraser is fitted on the layer-2 states of the pass edited at
    layer 1, so after both edits the class means at layer 2 coincide on the fitting items (LEACE zeroes the
    cross-covariance of the data it was fitted on). Simultaneous: it is fitted on clean layer-2 states, which the
    layer-1 edit has changed, so a class-mean gap remains."""
    adapter, _, fmt = _setup("gpt2")
    rng = random.Random(1)  # z = the last word (is / are), which the states at the last token carry
    z = torch.tensor([i % 2 for i in range(64)])
    items = [TextItem(str(i), " ".join([*(rng.choice(WORDS) for _ in range(rng.randint(2, 6))), ("is", "are")[c]]))
             for i, c in enumerate(z.tolist())]
    s1, s2 = Site(1, "last"), Site(2, "last")
    clean = adapter.map(items, fmt, read=[s1, s2]).acts
    seen: dict[str, dict[Site, tuple[torch.Tensor, list[Site]]]] = {"simultaneous": {}, "sequential": {}}

    def fitter(mode):
        def fit(s, X, upstream):
            seen[mode][s] = (X.clone(), list(upstream))
            return LEACE().fit(X, z)
        return fit

    fitted = {mode: fit_sites(adapter, items, fmt, [s1, s2], clean, fitter(mode), mode) for mode in seen}
    # what each mode's layer-2 eraser was fitted on
    upstream_states = adapter.map(items, fmt, read=[s2], edits={s1: Apply(fitted["sequential"][s1])}).acts[s2]
    assert torch.equal(seen["sequential"][s2][0], upstream_states) and seen["sequential"][s2][1] == [s1]
    assert torch.equal(seen["simultaneous"][s2][0], clean[s2]) and seen["simultaneous"][s2][1] == []
    assert (upstream_states - clean[s2]).abs().max() > 1e-3  # the upstream erasure did change layer 2
    for mode in seen:  # the first site is fitted on clean states either way
        assert torch.equal(seen[mode][s1][0], clean[s1]) and seen[mode][s1][1] == []
    gaps = {}
    for mode, f in fitted.items():
        after = adapter.map(items, fmt, read=[s2], edits={s: Apply(m) for s, m in f.items()}).acts[s2]
        gaps[mode] = _class_gap(after, z)
    assert _class_gap(clean[s2], z) > 0.05
    assert gaps["sequential"] < 1e-6, gaps  # float32 round-off (measured 2e-9)
    assert gaps["simultaneous"] > 1e-4, gaps  # measured 5e-4: over 10^5 times the sequential gap


def test_read_layers_spec():
    assert read_layers(None, [2], 4) == [2]
    assert read_layers("all", [2], 4) == [2, 3, 4]
    assert read_layers([4, 3], [2], 4) == [3, 4] and read_layers(-1, [2], 4) == [4]
    assert read_layers(None, [2, 3], 4) == [3] and read_layers("all", [2, 3], 4) == [3, 4]
    assert read_layers([2], [2, 3], 4) == [2]  # after the first edit, before the second
    with pytest.raises(ConfigError, match=r"come before the edit at layer 2"):
        read_layers([1, 4], [2], 4)
    with pytest.raises(ConfigError, match="out of range"):
        read_layers([5], [2], 4)


def test_edit_sites_layers_and_positions_as_data():
    rc = parse(Config, {"sites": [3, {"layer": 1, "position": "first"}, -1]}, "reliability")
    assert rc.sites == [3, EditSite(1, "first"), -1]
    assert edit_sites(rc, "last", "target", 4) == [Site(1, "first"), Site(3, "target"), Site(4, "target")]
    assert edit_sites(Config(), "last", "target", 4) == [Site(4, "target")]  # no sites: `layers`
    with pytest.raises(ConfigError, match="one layer per job"):
        edit_sites(Config(), "all", "target", 4)
    with pytest.raises(ConfigError, match="twice"):
        edit_sites(Config(sites=[4, -1]), "last", "target", 4)


@pytest.mark.parametrize("node, method, match", [
    ({"read_layers": "every"}, LEACE(), "use null"),
    ({"read_layers": []}, LEACE(), "selects no layer"),
    ({"sites": []}, LEACE(), "edits nothing"),
    ({"sites": [2, 2]}, LEACE(), "more than once"),
    ({"sites": [{"layer": 2, "position": "subject"}]}, LEACE(), "unknown position rule"),
    ({"sites": [2, 3], "mode": "sequential"}, MeanDiff(), "MeanDiff is counterfactual: use mode=simultaneous"),
    ({"mode": "together"}, LEACE(), "not one of"),
])
def test_bad_site_settings_are_refused_in_one_line(node, method, match):
    with pytest.raises(ConfigError, match=match) as e:
        _validate_sites(parse(Config, node, "reliability"), method, None)
    assert "\n" not in str(e.value)


def test_a_method_trained_through_the_model_is_refused_at_several_sites():
    """Dispatch on the capability (``needs_model``: trained through the frozen model at its site, e.g. DAS)."""
    class ThroughModel(LEACE):
        needs_model = True

    with pytest.raises(ConfigError, match="trained through the model at one site"):
        _validate_sites(parse(Config, {"sites": [2, 3]}, "reliability"), ThroughModel(), None)
    _validate_sites(parse(Config, {"sites": [2], "read_layers": "all"}, "reliability"), ThroughModel(), None)


def test_good_site_settings_pass():
    for node in ({}, {"read_layers": "all"}, {"read_layers": [3, 4]}, {"sites": [2, 3], "mode": "sequential"},
                 {"sites": [{"layer": 1, "position": "word:1"}, 2]}, {"mode": "sequential"}):
        _validate_sites(parse(Config, node, "reliability"), INLP(rank=2), None)


def _rows():
    rows = []
    for method, kind, base in (("leace", "nullifying", 0.5), ("mean_diff", "counterfactual", 0.0)):
        for l in range(1, 4):
            for lp in range(l, 4):
                acc = base + 0.1 * (lp - l)
                rows.append({"model": "m", "dataset": "d", "n_test": 40, "seed": 0, "oracle_probe": "linear", "method": method, "kind": kind,
                             "hparam": None if method == "leace" else "alpha",
                             "hparam_value": None if method == "leace" else 1.0, "layer": l, "read_layer": lp,
                             "sites": str(l), "mode": "single", "target": "z_c", "completeness": 1 - acc,
                             "selectivity": 0.9, "reliability": 0.5, "oracle_acc_edited_z_c": acc,
                             "oracle_acc_z_c": 1.0, "oracle_informative_z_c": l > 1, "delta_task_acc": 0.1 * l,
                             "task_acc_before": 1.0, "task_acc_after": 1 - 0.1 * l})
    return pd.DataFrame(rows)


def test_read_layer_table_and_heatmap(tmp_path):
    t = read_layer_table(_rows())
    assert len(t) == 12 and t["setting"].unique().tolist() == ["leace", "mean_diff alpha=1"]
    row = t[(t["setting"] == "leace") & (t["layer"] == 1) & (t["read_layer"] == 3)].iloc[0]
    assert row["oracle_acc_edited_z_c"] == pytest.approx(0.7) and row["delta_task_acc"] == pytest.approx(0.1)
    assert read_layer_heatmap(_rows(), tmp_path / "h.png") == tmp_path / "h.png"
    assert (tmp_path / "h.png").stat().st_size < 200_000
    assert read_layer_heatmap(_rows().query("read_layer == layer").head(1), tmp_path / "none.png") is None
    two = pd.concat([_rows(), _rows().assign(oracle_probe="mlp")])  # one panel column per oracle, never merged
    assert read_layer_heatmap(two, tmp_path / "two.png") is not None


def test_report_with_read_layers_writes_the_table_and_the_heatmap(tmp_path):
    from tests.conftest import assert_figures_captioned

    report(_rows(), tmp_path)
    assert (tmp_path / "read_layers.md").is_file() and (tmp_path / "fig_read_layers.png").is_file()
    assert tmp_path / "fig_read_layers.png" in assert_figures_captioned(tmp_path)
    assert (tmp_path / "table1.md").is_file()


def test_downstream_rows_become_records_at_their_read_layer():
    """Records (cprobe.records): read_layer is the oracles' layer l′ (the edited layer for a plain row), the oracle's
    accuracy on the edited states is its own registered metric (never an `oracle_accuracy` of a property
    "edited_z_c"), and a multi-site edit's sites and mode are part of its setting."""
    from cprobe import records as R
    from cprobe.tasks.reliability import RECORDS

    t = _rows().assign(n_scored=40)
    recs = R.to_records(t, RECORDS, "reliability", 0, "cfg")
    assert not R.problems(recs)
    c = recs[(recs["metric"] == "oracle_completeness") & (recs["method"] == "leace")]
    assert list(zip(c["layer"], c["read_layer"])) == [(l, lp) for l in range(1, 4) for lp in range(l, 4)]
    edited = recs[recs["metric"] == "edited_oracle_accuracy"]
    assert len(edited) == len(t) and set(edited["slice"]) == {'{"property":"z_c"}'}
    assert set(recs.loc[recs["metric"] == "oracle_accuracy", "slice"]) == {'{"property":"z_c"}'}
    multi = t.head(1).assign(mode="sequential", sites="2,3")
    (setting,) = set(R.to_records(multi, RECORDS, "reliability", 0, "cfg")["setting"])
    assert R.parse_cell(setting) == {"oracle": "linear", "sites": "2,3", "mode": "sequential"}


def test_read_layers_before_the_edit_are_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match=r"layer\(s\) \[1\] come before the edit at layer 2"):
        _validate_sites(Config(read_layers=[1, 3]), LEACE(), 2)
    with pytest.raises(ConfigError, match="come before the edit at layer 2"):
        _validate_sites(Config(read_layers=1, sites=[3, 2]), LEACE(), "last")
    for rc, layers in ((Config(read_layers=[2, 3]), 2), (Config(read_layers=[-1]), 2), (Config(read_layers=[1]), "last"),
                       (Config(read_layers="all"), 3), (Config(), 3)):
        _validate_sites(rc, LEACE(), layers)  # fine, or only decidable once the model's depth is known
