"""The prompt-bias study (Cao et al. 2022) through the CLI: bad input, the fact world with a small zoo end to end
(every table recomputed from the prediction file, the warm rerun served from caches), real-LAMA files with local
checkpoints, and the zoo's cached training (continued training included)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe.data.fact_world import FactWorldKeys, generate_world
from cprobe.errors import ConfigError
from cprobe.metrics import prompt_bias as M
from tests import cli
from tests.unit.test_fact_data import write_lama

SMALL = ["+experiment=lama_bias", "model=fact_zoo_smoke", "+debug=smoke", "dataset.n_relations=6",
         "dataset.facts_per_relation=10", "dataset.n_entities=40", "prompt_bias.subset=4",
         "+prompt_bias.controls.no_preference={prompt_skew: 0.0, alias_skew: 0.0}"]  # smoke runs drop the control


def cprobe(*args: str, cwd: Path, data: Path | None = None, cache: Path | None = None) -> cli.Result:
    """``cprobe *args`` in process (tests.cli.run), with ``data`` as the data dir and ``cache`` as the cache, if
    given."""
    env = {"CPROBE_DATA_DIR": str(data)} if data is not None else {}
    if cache is not None:
        env["CPROBE_CACHE_DIR"] = str(cache)
    return cli.run(*args, cwd=cwd, env=env)


@pytest.mark.parametrize("override, message", [  # in process: the CLI's own code path (tests.cli.run)
    ("prompt_bias.settings=[original,best]", "unknown evaluation setting 'best'; choose from"),
    ("prompt_bias.subset=7", "prompt_bias.subset must be in [1, 6]"),
    ("+prompt_bias.zoo.optimiser.lr=1", "unknown key(s) ['optimiser'] under prompt_bias.zoo"),
    ("+prompt_bias.zoo.train.stepz=1", "bad fact_world setting"),
    ("prompt_bias.disparity.base=[gpt9]", "prompt_bias.disparity.base ['gpt9']: each must be a fact-world member"),
    ("prompt_bias.models=[nonesuch]", "unknown model config 'nonesuch' for prompt_bias.models"),
    ("dataset=lama", "LAMA directory"),
    ("dataset=synthetic_sva", "the prompt_bias task needs a fact dataset"),
    ("dataset.prompts_per_relation=12", "prompts_per_relation must be in [1, 8]"),
    ("prompt_bias.top_k=0", "must be >= 1"),
    ("prompt_bias.disparity.gammas=[0.5,2]", "gammas must be a non-empty list in [0, 1]"),
    ("prompt_bias.instability_models=1", "prompt_bias.instability_models must be >= 2"),
    ("+prompt_bias.controls.main={prompt_skew: 0}", "'main' names the study's own zoo"),
    ("prompt_bias.controls.no_preference.prompt_skew=-1", "prompt_bias.controls.no_preference: "),
])
def test_bad_input_is_one_line_and_leaves_nothing(override, message, tmp_path):
    args = [a for a in SMALL if not a.startswith("dataset.")] if override.startswith("dataset=") else SMALL
    r = cli.run("run", *args, override, f"paths.output_root={tmp_path}", cwd=tmp_path,
                env={"CPROBE_DATA_DIR": str(tmp_path)})
    cli.assert_refused(r, message, tmp_path)


@pytest.mark.parametrize("relations, message", [
    ("", "relations.jsonl holds no relation"),
    ('{"relation": "P47", "template": "[X] borders [Y] .", "type": "N-M"}\n',
     "no relation left to probe: the 1 in relations.jsonl are all of a dropped type"),
])
def test_lama_without_relations_is_refused_before_any_model_loads(relations, message, tmp_path):
    base = write_lama(tmp_path)
    (base / "relations.jsonl").write_text(relations)
    r = cli.run("run", "+experiment=lama_bias", "dataset=lama", f"dataset.path={base}", "model=lama_hub_zoo",
                f"paths.output_root={tmp_path / 'out'}", cwd=tmp_path, env={"CPROBE_DATA_DIR": str(tmp_path)})
    cli.assert_refused(r, message, tmp_path / "out")
    assert not list(tmp_path.rglob("status.json"))


def test_a_zoo_is_refused_by_other_tasks(tmp_path):
    r = cli.run("run", "+experiment=sva_tiny", "model=fact_zoo", f"paths.output_root={tmp_path}", cwd=tmp_path)
    cli.assert_refused(r, "is a model zoo (a set of models); only task(s) ['prompt_bias', 'ravel'] read one", tmp_path)


@pytest.mark.slow
def test_the_fact_world_study_end_to_end_and_warm(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    r = cprobe("run", *SMALL, f"paths.output_root={out}", "hydra.run.dir=" + str(out / "job"), cwd=tmp_path,
               cache=cache)
    assert r.returncode == 0, r.stderr[-3000:]
    job = out / "job"
    t = pd.read_parquet(job / "metrics.parquet")
    pred = pd.read_parquet(job / "prompt_bias_predictions.parquet")
    world = generate_world(FactWorldKeys(n_relations=6, facts_per_relation=10, n_entities=40))
    n_queries = sum(len(r.prompts) * sum(len(f.mentions) for f in world.of(rid)) for rid, r in world.relations.items())
    # the study's zoo and the no-preference control zoo (the experiment's default control)
    assert len(pred) == 2 * 3 * n_queries and set(pred["model"]) == {"bert_small", "neox_small", "bert_lowgamma"}
    assert pred.groupby("variant").size().to_dict() == {"main": 3 * n_queries, "no_preference": 3 * n_queries}
    ctrl = pred[pred["variant"] == "no_preference"]
    pred = pred[pred["variant"] == "main"]
    assert not (ctrl["prediction"].to_numpy() == pred["prediction"].to_numpy()).all()  # other corpora, other models
    t, tc = t[t["variant"] == "main"], t[t["variant"] == "no_preference"]
    # every number is an aggregation of the prediction file
    p1 = M.precision_at_1(pred)
    mine = t[t["kind"] == "p1"].merge(p1, on=["model", "relation", "prompt"])
    assert len(mine) == len(p1) and np.allclose(mine["value"], mine["p1"])
    t1 = M.table1(M.prompt_spread(p1)).set_index("model")
    summary = t[t["kind"] == "summary"].pivot_table(index="model", columns="metric", values="value")
    for k in ("lama_p1", "worst_p1", "best_p1", "std", "diff_gt10_share"):
        np.testing.assert_allclose(summary.loc[t1.index, k], t1[k])
    stab = M.verbalization_stability(pred).groupby("model")["stability"].mean()
    np.testing.assert_allclose(summary.loc[stab.index, "verbalization_stability"], stab)
    assert (summary["true_knowledge"] > 0).all()
    rc = t[t["kind"] == "rank_consistency"]
    assert set(rc["setting"]) == {"original", "random", "backdoor", "backdoor_sampled"}
    models = ["bert_small", "neox_small", "bert_lowgamma"]
    for part, rows in ((pred, rc), (ctrl, tc[tc["kind"] == "rank_consistency"])):
        per, overall = M.consistency(M.bootstrap_orderings(M.stack(part, models), "backdoor", n_samples=100, subset=4,
                                                           seed=42))
        got = rows[rows["setting"] == "backdoor"].set_index("model")["value"]
        np.testing.assert_allclose(got[models], per)
        assert got["overall"] == pytest.approx(overall)
    # the control's corpora state the same facts (true knowledge) without prompt or name preferences
    know = tc[(tc["kind"] == "summary") & (tc["metric"] == "true_knowledge")].set_index("model")["value"]
    np.testing.assert_allclose(know[models], summary.loc[models, "true_knowledge"])
    disp = t[t["kind"] == "disparity"]
    assert sorted(disp["gamma"]) == [-1.0, -1.0, 0.0, 0.0, 1.0, 1.0]
    assert set(disp["model"]) == {"bert_small", "neox_small"}
    base = disp.loc[disp["gamma"] == -1.0, "value"].iloc[0]
    assert base == pytest.approx(summary.loc["bert_small", "lama_p1"])  # the "None" row is the zoo model itself
    for f in ("prompt_bias_table1.md", "prompt_bias_table3.md", "prompt_bias_table4.md", "prompt_bias_prompts.png",
              "prompt_bias_stability.png", "prompt_bias_relations.csv"):
        assert (job / f).is_file(), f
    from tests.conftest import assert_figures_captioned

    assert len(assert_figures_captioned(job)) == 2  # every figure names its relations, models, data, n, seed
    t4 = pd.read_csv(job / "prompt_bias_table4.csv")
    rows4 = [*models, "Overall Rank", "Draws with a tie (%)", "Closest pair", "Closest-pair gap (points)",
             "Closest-pair flips (%)"]
    assert list(t4["model"]) == rows4 * 2 and list(t4["variant"]) == ["main"] * 8 + ["no_preference"] * 8
    assert list(t4.columns[-5:]) == ["original", "random", "backdoor", "backdoor_sampled", "true_knowledge"]
    # warm: a second job (another seed) trains nothing and reads every prediction table from the cache
    r2 = cprobe("run", *SMALL, "seed=1", "hydra.run.dir=" + str(out / "job2"), cwd=tmp_path, cache=cache)
    assert r2.returncode == 0, r2.stderr[-3000:]
    timings = json.loads((out / "job2" / "status.json").read_text())
    log = r2.stdout + r2.stderr
    assert "cached" in log and "computed" not in log and "training tiny" not in log, log[-2000:]
    assert timings["state"] == "done" and timings["timings"]["zoo_s"] < 5
    t2 = pd.read_parquet(out / "job2" / "metrics.parquet")
    t2 = t2[t2["variant"] == "main"]
    same, cols = ["p1", "spread", "stability", "summary"], ["kind", "model", "relation", "prompt", "metric", "value"]
    pd.testing.assert_frame_equal(t[t["kind"].isin(same)][cols].reset_index(drop=True),
                                  t2[t2["kind"].isin(same)][cols].reset_index(drop=True), check_dtype=False)
    # the job seed moves the bootstrap draws only (rank_seed + seed; seed 0 = the paper's 42)
    r0 = rc.set_index(["setting", "model"])["value"]
    r1 = t2[t2["kind"] == "rank_consistency"].set_index(["setting", "model"])["value"]
    assert not np.allclose(r0.loc["random"], r1.loc["random"])
    # collect: the two jobs aggregate into mean (std) cells
    r3 = cprobe("collect", str(out), cwd=tmp_path, cache=cache)
    assert r3.returncode == 0, r3.stderr[-3000:]
    t4 = pd.read_csv(out / "prompt_bias_table4.csv")
    cell = t4.loc[(t4["model"] == "Overall Rank") & (t4["variant"] == "main"), "random"].iloc[0]
    both = sorted([r0.loc[("random", "overall")], r1.loc[("random", "overall")]])
    assert cell == f"{np.mean(both):.2f} ({np.std(both, ddof=1):.2f})"
    assert pd.read_csv(out / "prompt_bias_table1.csv")["LAMA P@1"].str.endswith("(0.00)").all()


def lama_model(path: Path, kind: str, words: list[str]) -> Path:
    from transformers import BertConfig, BertForMaskedLM, GPTNeoXConfig, GPTNeoXForCausalLM

    from cprobe.models.tiny import build_tokenizer

    tok = build_tokenizer("bert" if kind == "mlm" else "neox", words, 64)
    torch.manual_seed(0)
    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    model = BertForMaskedLM(BertConfig(**common)) if kind == "mlm" else GPTNeoXForCausalLM(GPTNeoXConfig(**common))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_real_lama_files_need_only_the_path_and_a_model(tmp_path):
    base = write_lama(tmp_path)
    words = sorted({w for line in (base / "relations.jsonl").read_text().splitlines()
                    for w in json.loads(line)["template"].split()} | {"Ulm", "Paris", "Woolsthorpe", "Albert",
                                                                     "Einstein", "Isaac", "Newton", "France", "FR",
                                                                     "birthplace", "native", "of", "The", "is", "a"})
    mlm = lama_model(tmp_path / "mlm", "mlm", words)
    clm = lama_model(tmp_path / "clm", "causal", [w for w in words if w != "Woolsthorpe"])
    out = tmp_path / "out"
    r = cprobe("run", "+experiment=lama_bias", "dataset=lama", f"dataset.path={base}", "model=bert_base_uncased",
               f"model.path={mlm}", "hydra.run.dir=" + str(out / "one"), "progress=false", cwd=tmp_path, data=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank consistency need at least two" in r.stdout + r.stderr
    pred = pd.read_parquet(out / "one" / "prompt_bias_predictions.parquet")
    assert len(pred) == 3 * 6 + 2 and set(pred["gold"]) == {"Ulm", "Woolsthorpe", "Paris"}
    # two local checkpoints as an inline zoo: the causal one lacks "Woolsthorpe", so that fact goes
    members = f"[{{name: m1, path: '{mlm}', kind: mlm}}, {{name: c1, path: '{clm}', kind: causal}}]"
    r = cprobe("run", "+experiment=lama_bias", "dataset=lama", f"dataset.path={base}", "model=lama_hub_zoo",
               f"model.members={members}", "prompt_bias.n_samples=20",  # the default subset: 2 relations -> 1
               "hydra.run.dir=" + str(out / "two"), "progress=false", cwd=tmp_path, data=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    pred = pd.read_parquet(out / "two" / "prompt_bias_predictions.parquet")
    assert set(pred["model"]) == {"m1", "c1"} and "Woolsthorpe" not in set(pred["gold"])
    assert "1 of 3 facts dropped" in r.stdout + r.stderr
    t = pd.read_parquet(out / "two" / "metrics.parquet")
    assert set(t[t["kind"] == "rank_consistency"]["model"]) == {"m1", "c1", "overall"}


def test_zoo_members_are_checked():
    from cprobe.models.zoo import members

    with pytest.raises(ConfigError, match="appear twice"):
        members({"name": "z", "source": "zoo", "members": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]})
    with pytest.raises(ConfigError, match="cloze probing needs kind mlm or causal"):
        members({"name": "z", "source": "zoo", "members": [{"name": "a", "path": "x", "kind": "encoder"}]})
    with pytest.raises(ConfigError, match="unknown key"):
        members({"name": "z", "source": "zoo", "members": [{"name": "a", "source": "fact_world", "fact_world":
                                                            {"corpus": {}, "optimiser": {}}}]})
    assert [m["name"] for m in members({"name": "one", "path": "p"})] == ["one"]
    assert [m["name"] for m in members({}, ["gpt2"])] == ["gpt2"]


def test_fact_models_are_cached_and_continue_training(tmp_path):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from cprobe.data.fact_world import CorpusSpec
    from cprobe.models.tiny import training_report
    from cprobe.models.zoo import fact_model_dir

    world = generate_world(FactWorldKeys(n_relations=2, n_entities=10, facts_per_relation=5))
    m = {"name": "b", "source": "fact_world", "kind": "mlm", "fact_world": {
        "corpus": {"sentences": 200, "gamma": 0.5},
        "train": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "max_positions": 24, "steps": 3}}}
    first = fact_model_dir(m, world, tmp_path, progress=False)
    assert fact_model_dir(m, world, tmp_path, progress=False) == first  # cached
    rep = training_report(first)
    assert rep["spec"]["corpus"]["gamma"] == 0.5 and rep["init"] is None and rep["n_train_sentences"] == 200
    more = fact_model_dir(m, world, tmp_path, progress=False, corpus=replace(CorpusSpec(sentences=50), gamma=1.0),
                          init_from=first)
    assert more != first and training_report(more)["init"] == rep["key"]
    assert AutoTokenizer.from_pretrained(more).get_vocab() == AutoTokenizer.from_pretrained(first).get_vocab()
    other = {**m, "fact_world": {**m["fact_world"], "corpus": {"sentences": 200, "gamma": 0.6}}}
    assert fact_model_dir(other, world, tmp_path, progress=False) != first  # the corpus is in the key


def _train_both(root: Path) -> dict:
    """Both fact-model kinds trained into ``root``: {kind: the weights' sha256 and the numerics they trained with}."""
    import hashlib

    from cprobe.models.tiny import training_report
    from cprobe.models.zoo import fact_model_dir

    world = generate_world(FactWorldKeys(n_relations=2, n_entities=10, facts_per_relation=5))
    out = {}
    for kind in ("mlm", "causal"):
        m = {"name": "b", "source": "fact_world", "kind": kind, "fact_world": {
            "corpus": {"sentences": 300, "gamma": 0.5},
            "train": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "max_positions": 24, "steps": 25}}}
        p = fact_model_dir(m, world, root, progress=False)
        out[kind] = {"sha": hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest(),
                     "numerics": training_report(p)["numerics"]}
    return out


def test_fact_models_train_bitwise_the_same_under_other_cpu_paths_and_threads(tmp_path, monkeypatch):
    # started from an environment as on another machine (ATen's generic kernels, MKL's SSE path, 3 threads), the
    # portable process trains the same BERT and GPT-NeoX weights: it pins the CPU paths and the thread count whatever
    # environment it starts from (a new portable process per environment; what starts it computes nothing)
    from cprobe.models import portable

    other = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "MKL_CBWR": "COMPATIBLE",
             "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    runs = []
    for i, extra in enumerate(({}, other)):
        with monkeypatch.context() as m:
            for k, v in extra.items():
                m.setenv(k, v)
            m.setattr(portable, "_WORKER", portable._Worker())
            try:
                runs.append(_train_both(tmp_path / str(i)))
            finally:
                portable._WORKER.close()
    for kind in ("mlm", "causal"):
        assert runs[0][kind]["sha"] == runs[1][kind]["sha"], kind
        assert runs[1][kind]["numerics"]["threads"] == 1
        if torch.cpu._is_avx2_supported():
            assert runs[1][kind]["numerics"]["cpu_capability"] == "AVX2"
            assert runs[1][kind]["numerics"]["mkl_cbwr"] == "AVX2,STRICT"
