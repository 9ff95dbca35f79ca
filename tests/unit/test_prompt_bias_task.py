"""The prompt-bias task's analysis and report on hand-built prediction tables (no model is run): one set of relation
draws for every setting, the subset default, rank instability of k models, ties and the closest pair in Table 4,
control zoos, and the config checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cprobe.errors import ConfigError
from cprobe.metrics import prompt_bias as M
from cprobe.tasks import prompt_bias as T


def predictions(accuracy, relations=8, subjects=10, prompts=1, mentions=1, seed=0):
    """A prediction table: model -> accuracy, the same for every relation, prompt and mention (random hits)."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, acc in accuracy.items():
        for r in range(relations):
            for p in range(prompts):
                for s in range(subjects):
                    for x in range(mentions):
                        ok = bool(rng.random() < acc)
                        rows.append({"model": model, "relation": f"R{r}", "prompt": p, "subject": f"s{s}",
                                     "mention": x, "gold": "g", "prediction": "g" if ok else "h", "correct": ok})
    return pd.DataFrame(rows)


def frame(rows):
    t = pd.DataFrame(rows)
    for col, fill in (("relation", ""), ("metric", ""), ("setting", ""), ("prompt", -1), ("gamma", np.nan)):
        if col not in t:
            t[col] = fill
        t[col] = t[col].fillna(fill)
    t["dataset"] = "fact_world"
    return t


def test_every_setting_ranks_on_the_same_relation_draws():
    # one prompt and one mention per subject: every setting scores a relation alike, so on shared draws they give
    # the same orderings, draw by draw — and the same consistency (drawn separately, random's would differ)
    pred = predictions({"a": 0.3, "b": 0.35, "c": 0.4}, relations=8, subjects=10)
    cfg = T.Config(n_samples=300, subset=4)
    rows = pd.DataFrame(T.analyse(pred, cfg, ["a", "b", "c"], seed=3))
    rc = rows[rows["kind"] == "rank_consistency"].pivot_table(index="model", columns="setting", values="value")
    assert rc["original"].min() < 100  # the draw matters
    for setting in ("random", "backdoor", "backdoor_sampled"):
        np.testing.assert_array_equal(rc[setting], rc["original"])


def test_the_subset_defaults_to_the_papers_share_of_the_relations():
    cfg = T.Config()
    assert cfg.subset is None
    assert [T.subset_size(cfg, n) for n in (24, 32, 3, 1)] == [15, 20, 2, 1]
    assert T.subset_size(T.Config(subset=7), 24) == 7
    with pytest.raises(Exception, match="subset=20 but only 8 relations"):
        T.analyse(predictions({"a": 0.3, "b": 0.4}), T.Config(subset=20, n_samples=5), ["a", "b"])
    rows = pd.DataFrame(T.analyse(predictions({"a": 0.3, "b": 0.4}), T.Config(n_samples=5), ["a", "b"]))
    assert set(rows.loc[rows["kind"] == "rank_consistency", "n"]) == {5}  # 5 of 8 relations per draw: it runs


def test_rank_instability_rows_for_k_models_and_all():
    pred = predictions({m: 0.2 + 0.1 * i for i, m in enumerate("abcde")}, relations=4, prompts=3)
    rows = pd.DataFrame(T.analyse(pred, T.Config(n_samples=5, subset=2, settings=[]), list("abcde")))
    ri = rows[rows["kind"] == "rank_instability"].set_index("model")["value"]
    p1 = M.precision_at_1(pred)
    assert ri["all 5"] == M.rank_instability(p1)
    assert ri["4 of 5 (mean over 5 sets)"] == pytest.approx(M.rank_instability_k(p1, 4)[0])
    named = pd.DataFrame(T.analyse(pred, T.Config(n_samples=5, subset=2, settings=[],
                                                  instability_models=["a", "c"]), list("abcde")))
    assert named.loc[named["kind"] == "rank_instability", "model"].tolist() == ["all 5", "a, c"]


def test_table4_reports_ties_and_the_closest_pair_per_variant():
    # x and y know nothing (tied at 0 in every draw); p and q are 5 points apart
    pred = pd.concat([predictions({"x": 0.0, "y": 0.0}), predictions({"p": 0.4}, seed=1),
                      predictions({"q": 0.9}, seed=2)], ignore_index=True)
    cfg = T.Config(n_samples=50, subset=4, settings=["original", "backdoor"])
    rows = T.analyse(pred, cfg, ["x", "y", "p", "q"], seed=1)
    rows += T.analyse(pred, cfg, ["x", "y", "p", "q"], seed=1, variant="no_preference")
    t4 = T.table4(frame(rows)).set_index(["variant", "model"])
    assert list(t4.columns[-2:]) == ["original", "backdoor"]
    main = t4.loc["main"]
    assert main.loc["x", "original"] == "100.00" and main.loc["Overall Rank", "original"] == "100.00"
    assert main.loc["Draws with a tie (%)", "original"] == "100.00"
    assert main.loc["Closest pair", "original"] == "x / y"
    assert main.loc["Closest-pair gap (points)", "original"] == "0.00"
    assert main.loc["Closest-pair flips (%)", "original"] == "0.0"
    assert "no_preference" in t4.index.get_level_values(0)
    ties = T.ties_table(frame(rows)).set_index(["variant", "model"])
    assert ties.loc[("main", "x"), "original"] == "100.00" and ties.loc[("main", "q"), "original"] == "0.00"
    pairs = T.pair_table(frame(rows))
    first = pairs[(pairs["variant"] == "main") & (pairs["setting"] == "original")].iloc[0]
    assert first["pair"] == "x|y" and first["tied"] == 100.0


def test_tables_from_before_controls_read_as_the_main_variant():
    rows = T.analyse(predictions({"a": 0.3, "b": 0.6}), T.Config(n_samples=5, subset=2, settings=["original"]),
                     ["a", "b"])
    old = frame(rows).drop(columns="variant")
    t4 = T.table4(old)
    assert set(t4["variant"]) == {"main"} and "Overall Rank" in set(t4["model"])
    assert set(T.table1(old)["variant"]) == {"main"}


def member(name, **corpus):
    return {"name": name, "source": "fact_world", "kind": "mlm",
            "fact_world": {"corpus": {"sentences": 100, "prompt_skew": 3.0, **corpus}, "train": {"steps": 2}}}


def test_controls_change_only_their_corpus_keys():
    ms = [member("a", skew_seed=1), member("b", skew_seed=2), {"name": "hub", "path": "/x", "kind": "mlm"}]
    v = T.with_controls(ms, {"no_preference": {"prompt_skew": 0.0, "alias_skew": 0.0}})
    assert list(v) == ["main", "no_preference"]
    assert v["main"] == ms
    c = v["no_preference"]
    assert [m["name"] for m in c] == ["a", "b", "hub"] and c[2] == ms[2]
    assert c[0]["fact_world"]["corpus"] == {"sentences": 100, "prompt_skew": 0.0, "alias_skew": 0.0, "skew_seed": 1}
    assert c[0]["fact_world"]["train"] == {"steps": 2}
    assert T.with_controls(ms, {}) == {"main": ms}


@pytest.mark.parametrize("controls, message", [
    ({"main": {"prompt_skew": 0.0}}, "'main' names the study's own zoo"),
    ({"flat": {}}, "prompt_bias.controls.flat must be a non-empty mapping"),
    ({"flat": {"prompt_skew": -1.0}}, "prompt_bias.controls.flat: .*skews"),
    ({"flat": {"promptskew": 0.0}}, "prompt_bias.controls.flat: .*bad fact_world setting"),
])
def test_bad_controls_are_refused(controls, message):
    with pytest.raises(ConfigError, match=message):
        T.with_controls([member("a")], controls)


def test_zoo_overrides_skip_null_keys():
    ms = [member("a", skew_seed=1)]
    out = T.with_zoo_overrides(ms, {"corpus": {"gamma": None, "sentences": 50}, "train": {"steps": None}})
    assert out[0]["fact_world"]["corpus"]["sentences"] == 50 and "gamma" not in out[0]["fact_world"]["corpus"]
    assert out[0]["fact_world"]["train"] == {"steps": 2}
    assert T.with_zoo_overrides(ms, {"corpus": {"gamma": None}, "train": {}}) == ms


def test_fig3_is_a_grid_of_panels(tmp_path):
    from PIL import Image

    rows = [{"kind": "p1", "model": f"m{m}", "relation": f"R{r:02d}", "prompt": p, "value": float((m * 7 + r * 3 + p)
                                                                                                   % 100), "n": 40}
            for m in range(8) for r in range(24) for p in range(6)]
    T._plot_prompts(frame(rows), tmp_path)
    width, height = Image.open(tmp_path / "prompt_bias_prompts.png").size
    assert width < 2000 and height > width / 2  # 4 rows of 2 panels, not an 8-panel strip (7,900 x 370 px)


def test_the_docs_zoo_override_runs_as_written():
    # docs/prompt_bias.md: `prompt_bias.zoo.train.steps=3000` (no `+`): the experiment lists every key as null
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe.config import parse
    from cprobe.models.zoo import fact_settings, members
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=lama_bias",
                                                                  "prompt_bias.zoo.train.steps=3000"]), resolve=False)
    config = parse(T.Config, cfg["prompt_bias"], "prompt_bias")
    assert config.subset is None and config.stop_words == "reference" and config.case_sensitive
    assert config.controls == {"no_preference": {"prompt_skew": 0.0, "alias_skew": 0.0}}
    ms = T.with_zoo_overrides(members({**cfg["model"], "dtype": "float32"}), config.zoo)
    assert len(ms) == 8 and {fact_settings(m)[1].steps for m in ms} == {3000}
    assert {fact_settings(m)[0].sentences for m in ms} == {30_000}  # null keys keep each member's own


def test_smoke_drops_the_control_zoo_and_passes_validation(tmp_path):
    """`--smoke` (+debug=smoke) lays `controls: null` over the experiment: no control zoo (merging `{}` would have kept
    the experiment's entry and trained and probed 8 more models), and the job passes the pre-flight checks."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe.config import parse
    from cprobe.pipeline import prepare
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=lama_bias", "+debug=smoke",
                                                                  f"paths.cache_dir={tmp_path}"]), resolve=True)
    config = parse(T.Config, cfg["prompt_bias"], "prompt_bias")
    assert config.controls is None and T.with_controls([{"name": "a"}], config.controls) == {"main": [{"name": "a"}]}
    cfg.pop("paths", None)
    assert prepare(cfg).keys.task == "prompt_bias"
