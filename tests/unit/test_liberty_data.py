"""LIBERTy benchmarks: the template realiser, the generated splits and structural counterfactual pairs, and the
loader for a user's own texts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cprobe.data.items import TextItem
from cprobe.data.liberty import LibertyKeys, generate, load_liberty
from cprobe.data.realiser import TemplateRealiser
from cprobe.data.scm import SCM
from cprobe.errors import ConfigError, DataError


@pytest.fixture(scope="module", params=["cv", "violence", "disease"])
def bench(request):
    scm = SCM.load(request.param)
    return scm, generate(scm, LibertyKeys(n_explained=200, n_explainer=60), request.param, seed=0)


def test_splits_and_pairs_follow_the_papers_design(bench):
    scm, data = bench
    assert [len(data.splits[s]) for s in ("train", "test", "explainer")] == [160, 40, 60]
    ids = [it.id for s in data.splits.values() for it in s]
    assert len(set(ids)) == len(ids)
    assert len(data.pairs) == 3 * 40
    by_base: dict[str, list[str]] = {}
    for p in data.pairs:
        (c,) = p.intervened
        assert c in scm.concepts and c != scm.label  # the label is never intervened on
        v, v2 = p.changes[c]
        assert v != v2 and p.source.meta["unit"] == p.base.meta["unit"]
        by_base.setdefault(p.base.id, []).append(c)
    assert all(len(set(cs)) == 3 for cs in by_base.values())  # 3 distinct concepts per test text
    assert set(by_base) == {it.id for it in data.splits["test"]}


def test_a_counterfactual_changes_only_the_intervened_concept_and_its_descendants(bench):
    scm, data = bench
    label_changed = 0
    for p in data.pairs:
        (c,) = p.intervened
        allowed = {c, *scm.descendants(c)}
        for k in scm.concepts:
            if k not in allowed:
                assert p.source.concepts[k] == p.base.concepts[k]
        if scm.label not in allowed:
            assert p.source.outcome == p.base.outcome
        label_changed += p.source.outcome != p.base.outcome
        # the counterfactual's values are the SCM's: re-solving the base's stored noise under do(C = c′)
        from cprobe.data.scm import Noise

        cf = scm.counterfactual(Noise.from_rows([p.base.meta["noise"]]), {c: p.changes[c][1]})
        assert {k: scm.variables[k].values[int(cf[k][0])] for k in scm.concepts} == dict(p.source.concepts)
    assert (label_changed > 0) == (scm.label != "disease")  # Disease: the label is the root


def test_texts_state_the_values_and_counterfactual_texts_differ_only_where_values_do(bench):
    scm, data = bench
    real = TemplateRealiser(scm)
    for p in data.pairs[:30]:
        base_vals = {**p.base.concepts, scm.label: p.base.outcome}
        cf_vals = {**p.source.concepts, scm.label: p.source.outcome}
        said, said_cf = real.sentences(base_vals, p.base.meta["text_noise"]), real.sentences(cf_vals,
                                                                                             p.base.meta["text_noise"])
        for v, s in said.items():
            assert s in p.base.text and said_cf[v] in p.source.text
            if base_vals[v] == cf_vals[v]:
                assert said_cf[v] == s
        # same noise, same values → the same text (the factual counterfactual is exact, text included)
        assert real.realise(base_vals, p.base.meta["text_noise"]) == p.base.text
        left = set(p.base.text.split(". ")) - set(p.source.text.split(". "))
        assert left, "a change of a concept value changes the text"
    if scm.label == "disease":
        assert all(name.lower() not in it.text.lower() for it in data.splits["train"]
                   for name in scm.variables["disease"].values)


def test_no_concept_sits_at_a_fixed_position(bench):
    scm, data = bench
    real = TemplateRealiser(scm)
    first = real.expresses[0]
    positions = [it.meta["text_noise"]["order"].index(0) for it in data.splits["train"][:60]]
    assert len(set(positions)) > 3, first
    variants = {real.sentences({**it.concepts, scm.label: it.outcome}, it.meta["text_noise"])[first]
                for it in data.splits["train"]}
    assert len(variants) > len(scm.variables[first].values)  # several phrasings per value


def test_generation_is_seeded():
    scm = SCM.load("cv")
    a = generate(scm, LibertyKeys(n_explained=20, n_explainer=10), "cv", 4)
    b = generate(scm, LibertyKeys(n_explained=20, n_explainer=10), "cv", 4)
    c = generate(scm, LibertyKeys(n_explained=20, n_explainer=10), "cv", 5)
    assert [p.source.text for p in a.pairs] == [p.source.text for p in b.pairs]
    assert [it.text for it in a.splits["train"]] != [it.text for it in c.splits["train"]]


def test_a_phrase_bank_missing_a_value_is_an_error():
    d = {"name": "t", "label": "y", "variables": {"a": {"values": ["x", "z"], "distribution": "uniform"},
                                                  "y": {"values": ["n", "p"], "terms": {"a": 1.0}}},
         "text": {"expresses": ["a"], "openings": ["Hi."], "closings": ["Bye."], "personas": ["I knit."],
                  "phrases": {"a": {"x": ["It is x."]}}}}
    with pytest.raises(ConfigError, match=r"scm t: text.phrases.a.z must be a non-empty list"):
        TemplateRealiser(SCM.from_dict(d))
    d["text"]["expresses"] = ["q"]
    with pytest.raises(ConfigError, match="expresses: unknown variable 'q'"):
        TemplateRealiser(SCM.from_dict(d))
    with pytest.raises(ConfigError, match="dataset.n_explained and dataset.n_explainer must be >= 10"):
        LibertyKeys(n_explained=5)


# ----------------------------------------------------------------------------------------------- user texts
def _rows(data, scm) -> list[dict]:
    rows = []
    for split in ("train", "test", "explainer"):
        for it in data.splits[split]:
            rows.append({"id": it.id, "text": it.text, "split": split, **it.concepts, scm.label: it.outcome})
    for p in data.pairs:
        rows.append({"id": p.source.id, "text": p.source.text, "split": "counterfactual", **p.source.concepts,
                     scm.label: p.source.outcome, "base_id": p.base.id, "intervened": p.intervened[0]})
    return rows


def _base(rows: list[dict], i: int) -> dict:
    return next(r for r in rows if r["id"] == rows[i]["base_id"])


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_a_users_texts_load_and_are_checked_against_the_scm(tmp_path):
    scm = SCM.load("cv")
    data = generate(scm, LibertyKeys(n_explained=40, n_explainer=12), "cv", 0)
    rows = _rows(data, scm)
    _write(tmp_path / "mine.jsonl", rows)
    loaded = load_liberty(LibertyKeys(texts="mine.jsonl"), tmp_path, "mine")
    assert [it.text for it in loaded.splits["test"]] == [it.text for it in data.splits["test"]]
    assert [(p.base.id, p.changes) for p in loaded.pairs] == [(p.base.id, p.changes) for p in data.pairs]
    assert isinstance(loaded.splits["train"][0], TextItem) and loaded.scm.name == "cv"

    made: list[Path] = []

    def broken(i: int, **change) -> Path:
        bad = [dict(r) for r in rows]
        bad[i].update(change)
        made.append(_write(tmp_path / f"bad-{len(made)}.jsonl", bad))
        return made[-1]

    cf = next(i for i, r in enumerate(rows) if r["split"] == "counterfactual" and r["intervened"] == "education")
    other = "Female" if rows[cf]["gender"] == "Male" else "Male"
    train_id = data.splits["train"][0].id
    cases = [(broken(0, race="Martian"), "'Martian' is not a value of 'race'"),
             (broken(cf, education=_base(rows, cf)["education"]),
              "education has the base's value"),
             (broken(cf, base_id=train_id), f"base_id '{train_id}' is not a test text"),
             (broken(cf, gender=other), "['gender'] changed although not descendants of the intervened 'education'"),
             (broken(cf, base_id="nope"), "base_id 'nope' is not a test text"),
             (broken(0, split="dev"), "unknown split(s) ['dev']"),
             (tmp_path / "missing.jsonl", "does not exist")]
    for p, message in cases:
        with pytest.raises(DataError) as e:
            load_liberty(LibertyKeys(texts=str(p)), tmp_path, "x")
        assert message in str(e.value) and "\n" not in str(e.value)
    no_col = [{k: v for k, v in r.items() if k != "age"} for r in rows]
    with pytest.raises(DataError, match=r"missing column\(s\) \['age'\]"):
        load_liberty(LibertyKeys(texts=str(_write(tmp_path / "nc.jsonl", no_col))), tmp_path, "x")


def test_the_dataset_registry_builds_it_and_subsamples_the_train_split():
    from cprobe.data.registry import load_dataset

    data = load_dataset({"name": "liberty_cv", "type": "liberty", "scm": "cv", "n_explained": 100, "n_explainer": 20,
                         "max_examples": 30}, Path("."))
    assert len(data.splits["train"]) == 30 and len(data.splits["test"]) == 20 and len(data.pairs) == 60
    assert np.all([it.id.startswith("cv-") for it in data.splits["train"]])


def test_numeric_ids_and_digit_named_values_load_as_written(tmp_path):
    import pandas as pd

    d = {"name": "digits", "label": "y", "variables": {
        "a": {"values": ["1", "2", "3"], "distribution": "uniform"},
        "y": {"values": ["0", "1"], "terms": {"a": 0.5}, "noise": {"sd": 0.1}}}}
    scm = SCM.from_dict(d)
    rows = [{"id": i, "text": f"text {i}", "split": s, "a": a, "y": 1}
            for i, s, a in ((1, "train", 1), (2, "test", 2), (3, "explainer", 3))]
    rows.append({"id": 32, "text": "text 32", "split": "counterfactual", "a": 3, "y": 1, "base_id": 2,
                 "intervened": "a"})
    for suffix in (".csv", ".jsonl"):
        path = tmp_path / f"digits{suffix}"
        if suffix == ".csv":
            pd.DataFrame(rows).to_csv(path, index=False)
        else:
            _write(path, rows)
        from cprobe.data.liberty import load_texts

        data = load_texts(scm, path, "digits")
        (pair,) = data.pairs
        assert pair.base.id == "2" and pair.source.id == "32"
        assert pair.changes == {"a": ("2", "3")}  # the value named "2", not the value at index 2
        assert data.splits["train"][0].concepts == {"a": "1"}


def test_queries_carry_only_the_base_side_and_the_change():
    from cprobe.explainers import Observed
    from cprobe.tasks.effects import pair_queries

    scm = SCM.load("cv")
    data = generate(scm, LibertyKeys(n_explained=30, n_explainer=10), "cv", 0)
    items = [*data.splits["test"], *(p.source for p in data.pairs)]
    index = {it.id: i for i, it in enumerate(items)}
    code = {c: {v: str(i) for i, v in enumerate(scm.variables[c].values)} for c in scm.concepts}
    everything = Observed(texts=[it.text for it in items], probs=np.full((len(items), 3), 1 / 3),
                          concepts=[dict(it.concepts) for it in items], labels=np.zeros(len(items), dtype=int),
                          predicted=[{"race": "0"}] * len(items), groups=[it.meta["unit"] for it in items])
    q = pair_queries(data.pairs, everything, index, lambda c, v: code[c][v])
    assert q.base.concepts is None and q.base.labels is None  # no gold label of a query
    assert list(q.base.texts) == [p.base.text for p in data.pairs]  # never the counterfactual's text
    assert q.base.predicted is not None and len(q) == len(data.pairs)
    for i, p in enumerate(data.pairs):
        (c,) = p.intervened
        v, v2 = p.changes[c]
        assert (q.aspect[i], q.c[i], q.c_prime[i]) == (c, code[c][v], code[c][v2])


def test_fine_tuning_precision_is_fp32_or_bf16():
    from cprobe.models.classifier import FinetuneConfig

    assert FinetuneConfig(precision="bf16").precision == "bf16" and FinetuneConfig().precision == "fp32"
    with pytest.raises(ValueError, match="precision must be fp32 or bf16"):
        FinetuneConfig(precision="fp16")


@pytest.mark.parametrize("benchmark, n_test, pairs, paper", [("cv", 334, 1002, 998), ("disease", 311, 933, 932),
                                                               ("violence", 439, 1317, 1317)])
def test_the_benchmarks_have_the_papers_test_texts_and_pair_counts(benchmark, n_test, pairs, paper):
    """Table 6: D_c⃗ − Pairs = the base texts (1,332 − 998 = 334, 1,243 − 932 = 311, 1,756 − 1,317 = 439), three changes
    each; the test texts are drawn beside D_f (1.5K), not out of it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cprobe.data.registry import split_config
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        node = OmegaConf.to_container(compose("config", overrides=[f"+experiment=liberty_{benchmark}"]))["dataset"]
    _, _, keys = split_config(node)
    assert (keys.n_explained, keys.n_test, keys.n_explainer, keys.changes) == (1500, n_test, 500, 3)
    assert keys.n_test * keys.changes == pairs and pairs - paper in (0, 1, 4)
    small = generate(SCM.load(benchmark), LibertyKeys(scm=benchmark, n_explained=40, n_test=12, n_explainer=30),
                     benchmark, 0)
    assert [len(small.splits[s]) for s in ("train", "test", "explainer")] == [40, 12, 30]
    assert len(small.pairs) == 36 and {p.base.id for p in small.pairs} == {it.id for it in small.splits["test"]}
    with pytest.raises(ConfigError, match="dataset.n_test must be >= 1"):
        LibertyKeys(n_test=0)


def test_max_pool_draws_part_of_d_m_for_the_pool_and_the_concept_classifier_and_nothing_else():
    from cprobe.tasks.liberty import Config, pool_texts, study

    scm = SCM.load("cv")
    data = generate(scm, LibertyKeys(n_explained=60, n_explainer=50, n_test=20), "cv", seed=0)
    every, few = study(data, Config()), study(data, Config(max_pool=30))
    d_m = [it.id for it in data.splits["explainer"]]
    pool = [few.texts[i].id for i in few.pool]
    assert [every.texts[i].id for i in every.pool] == d_m  # null: all of D_M
    assert len(pool) == 30 and pool == [i for i in d_m if i in set(pool)]  # 30 of them, in D_M's order
    assert [it.id for it in few.concept_train] == pool and len(few.concept_targets) == 30
    assert pool == [it.id for it in pool_texts(data, Config(max_pool=30))]  # drawn once (seed 0): every call, every seed
    assert [it.id for it in few.train] == [it.id for it in every.train]  # D_f, the test texts and the pairs as they were
    assert [p.id for p in few.pairs] == [p.id for p in every.pairs]
    assert {it.id for it in data.splits["test"]} <= {it.id for it in few.texts}
    assert len(few.texts) == len(every.texts) - 20


def test_a_job_warns_about_the_pool_it_uses_not_the_one_generated(monkeypatch):
    """The size warnings read D_M as the job uses it (``max_pool``): 60 generated, 30 used -> "has only 30 texts"."""
    from types import SimpleNamespace

    from cprobe.tasks import liberty

    data = generate(SCM.load("cv"), LibertyKeys(n_explained=400, n_explainer=60, n_test=60), "cv", seed=0)
    warned: list[str] = []

    def stop(*_a, **_k):
        raise KeyboardInterrupt  # the engine is not this test's business

    monkeypatch.setattr(liberty, "run_effects", stop)
    ctx = SimpleNamespace(cfg={}, dataset=lambda: data, warn=warned.append)
    for max_pool, n in ((None, 60), (30, 30)):
        warned.clear()
        with pytest.raises(KeyboardInterrupt):
            liberty.run(ctx, liberty.Config(max_pool=max_pool))
        assert [w for w in warned if w.startswith("D_M")] == [
            f"D_M (dataset.n_explainer) has only {n} texts (fewer than 200): explainer scores on so small a benchmark "
            "are unreliable"]
