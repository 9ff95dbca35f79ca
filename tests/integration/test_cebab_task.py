"""The CEBaB study on a tiny BERT encoder and small CEBaB-format files the tests write: the fine-tuned classifier
(φ as a site, cache, exact resume), CausaLM's re-training, the task through the CLI, and its bad-input errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe.data.cebab import ASPECTS, VALUES, CebabKeys, labelled, load_cebab
from cprobe.models.classifier import FinetuneConfig, classify, finetuned_classifier, phi_site, wrap
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.load import load_adapter
from tests import cli
from tests.cebab_fixtures import check_pair_effects, tiny_encoder_dir, write_cebab



@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cebab")
    write_cebab(root, n_train=40, n_eval=8)
    enc_dir = tiny_encoder_dir(root / "encoder")
    return root, enc_dir


@pytest.fixture(scope="module")
def encoder(world):
    _, enc_dir = world
    return load_adapter({"name": "tiny_enc", "path": str(enc_dir), "kind": "encoder", "batch_size": 16},
                        Path("/nonexistent"))


def test_phi_is_the_site_the_head_reads(encoder, world):
    clf = wrap(encoder, 3)
    items = list(load_cebab(CebabKeys(), world[0]).splits["dev"])[:6]
    phi, logp = classify(clf, items, 64)
    batch = ClassificationFormatter(64)(items, clf, torch.arange(len(items))).to(clf.device)  # where the model is
    with torch.inference_mode():
        direct = clf.model.features(batch.input_ids, batch.attention_mask)
        logits = clf.model.head(direct)
    direct, logits = direct.cpu(), logits.cpu()
    order = torch.arange(len(items))  # map() restores input order
    torch.testing.assert_close(phi[order], direct, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp, logits.log_softmax(-1), atol=1e-5, rtol=1e-5)
    assert phi_site(clf).position == "cls" and clf.kind == "classifier"
    assert clf.model.base_model is not encoder.model  # the encoder itself is never trained in place


@pytest.mark.slow
def test_finetuning_learns_caches_and_resumes_exactly(encoder, world, tmp_path, monkeypatch):
    from cprobe.models import classifier as mod

    data = load_cebab(CebabKeys(), world[0])
    items, y = labelled(data.splits["train"], "2way")
    cfg = FinetuneConfig(epochs=3, lr=3e-3, batch_size=8, max_length=64)
    a, cached = finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, cfg, 0, tmp_path / "a", "t", False)
    assert not cached
    _, logp = classify(a, items, 64)
    assert float((logp.argmax(1).numpy() == np.array(y)).mean()) > 0.8  # it learned the sentiment words
    b, cached = finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, cfg, 0, tmp_path / "a", "t", False)
    assert cached
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        torch.testing.assert_close(v, w, msg=k)
    # an interruption after epoch 1 resumes from the checkpoint and ends where an uninterrupted run does
    real = mod._checkpoint

    def crash(model, opt, epochs_done, path):
        real(model, opt, epochs_done, path)
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, cfg, 0, tmp_path / "c", "t", False)
    assert list((tmp_path / "c").glob("*.partial.safetensors"))
    monkeypatch.setattr(mod, "_checkpoint", real)
    c, cached = finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, cfg, 0, tmp_path / "c", "t", False)
    assert not cached and not list((tmp_path / "c").glob("*.partial.safetensors"))
    for (k, v), w in zip(a.model.state_dict().items(), c.model.state_dict().values()):
        torch.testing.assert_close(v, w, atol=1e-6, rtol=1e-5, msg=lambda m: f"{k}: {m}")
    # another seed is another model (and another cache entry); so are other labels for the same texts
    d, cached = finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, cfg, 1, tmp_path / "a", "t", False)
    assert not cached and len(list((tmp_path / "a").glob("*.safetensors"))) == 2
    flipped = 1 - torch.tensor(y)
    _, cached = finetuned_classifier(encoder, items, flipped, 1, 2, FinetuneConfig(epochs=1, lr=3e-3, batch_size=8,
                                     max_length=64), 0, tmp_path / "e", "t", False)
    _, cached2 = finetuned_classifier(encoder, items, torch.tensor(y), 1, 2, FinetuneConfig(
        epochs=1, lr=3e-3, batch_size=8, max_length=64), 0, tmp_path / "e", "t", False)
    assert not cached and not cached2


@pytest.mark.slow
def test_causalm_retrains_the_encoder_per_concept(encoder, world, tmp_path):
    from cprobe.explainers import EXPLAINERS, ExplainedModel, Observed, Queries
    from cprobe.explainers.base import TrainingRegime

    data = load_cebab(CebabKeys(), world[0])
    items, y = labelled(data.splits["train"], "3way")
    cfg = FinetuneConfig(epochs=2, lr=1e-3, batch_size=8, max_length=64)
    clf, _ = finetuned_classifier(encoder, items, torch.tensor(y), 1, 3, cfg, 0, tmp_path, "t", False)
    phi, logp = classify(clf, items, 64)
    concepts = [{a: it.concepts[a] for a in ASPECTS[:2]} for it in items]
    train = Observed([it.text for it in items], logp.exp().numpy(), concepts=concepts, reps=phi, labels=np.array(y))
    model = ExplainedModel(clf.model.head, 3, ASPECTS[:2], VALUES, regime=TrainingRegime(clf, 64, 0))
    ex = EXPLAINERS.build({"name": "causalm", "epochs": 1, "head_epochs": 2}, seed=0).fit(model, train)
    assert ex.control_ == {"food": "service", "service": "food"}
    for concept, enc in ex.encoders_.items():
        changed = any(not torch.equal(p, q) for p, q in zip(enc.base_model.parameters(),
                                                             clf.model.base_model.parameters()))
        assert changed, concept
    base = Observed(train.texts[:5], train.probs[:5], reps=phi[:5])
    q1 = ex.explain(Queries(base, ["food"] * 5, ["Negative"] * 5, ["Positive"] * 5))
    q2 = ex.explain(Queries(base, ["food"] * 5, ["Negative"] * 5, ["unknown"] * 5))
    np.testing.assert_allclose(q1, q2)  # removal only
    np.testing.assert_allclose(q1.sum(1), 0.0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- the CLI
def cprobe(*args: str, cwd: Path, data: Path) -> cli.Result:
    """``cprobe *args`` in process (tests.cli.run) with ``data`` as the data dir."""
    return cli.run(*args, cwd=cwd, env={"CPROBE_DATA_DIR": str(data)})


def _tiny(world) -> list[str]:
    return ["+experiment=cebab", "model=bert_base_uncased", f"model.path={world[1]}", "model.finetune.lr=3e-3",
            "model.finetune.max_length=64"]


@pytest.mark.parametrize("override, message", [
    ("cebab.explainers=[random,shap]", "unknown explainer 'shap'; choose from"),
    ("cebab.aspects=[food,decor]", "unknown aspect(s) ['decor']"),
    ("cebab.task=4way", "cebab.task"),
    ("cebab.max_scored_texts=0", "cebab.max_scored_texts must be >= 1 (or null for all), got 0"),
    ("dataset=lgd", "the cebab task needs dataset=cebab"),
    ("cebab.distances=[l1]", "unknown distance 'l1'"),
    ("cebab.finetune.lr=nan", "cebab.finetune: lr must be a finite number, got nan"),
    ("cebab.concept_model.epochs=0", "cebab.concept_model: epochs and batch_size must be >= 1"),
    ("cebab.explainer.inlp.head_lr=inf", "cebab.explainer.inlp.head_lr must be a finite number, got inf"),
])
def test_bad_input_is_one_line_and_leaves_nothing(override, message, world, tmp_path):
    """In process: the CLI's own code path (tests.cli.run)."""
    r = cli.run("run", *_tiny(world), override, f"paths.output_root={tmp_path}", cwd=tmp_path,
                env={"CPROBE_DATA_DIR": str(world[0])})
    cli.assert_refused(r, message, tmp_path)


@pytest.mark.slow
def test_the_study_runs_end_to_end_and_a_sweep_aggregates(world, tmp_path):
    out = tmp_path / "out"
    r = cprobe("run", "-m", *_tiny(world), "cebab.task=2way,5way", "seed=0,1", "cebab.finetune.epochs=4",
               "cebab.concept_model.epochs=4", "cebab.explainer.conceptshap.epochs=3", "cebab.explainer.conceptshap.hidden=32",
               f"paths.output_root={out}", "progress=false", cwd=tmp_path, data=world[0])
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [p.parent for p in out.rglob("status.json")]
    assert len(runs) == 4
    t = pd.concat([pd.read_parquet(d / "metrics.parquet") for d in runs])
    assert set(t["kind"]) >= {"classifier", "pairs", "ate", "cace", "acace", "icace_error", "explainer"}
    err = t[(t["kind"] == "icace_error") & (t["aspect"] == "all")]
    assert set(err["explainer"]) == {"random", "approx", "conexp", "s_learner", "tcav", "conceptshap", "inlp", "leace"}
    assert set(err["distance"]) == {"l2", "cosine", "normdiff"} and len(err) == 4 * 8 * 3
    # the per-pair file: true ICaCE = N(φ(x_cf)) − N(φ(x_base)); the tables' errors and the CaCE recomputed from it
    # (the same check on the README's real-data run: tests/smoke/test_studies_collect.py)
    check_pair_effects(runs[0])
    # Table 8 rows for both evaluation splits of every job (learning itself: test_finetuning_learns_...)
    acc = t[(t["kind"] == "classifier") & (t["explainer"] == "explained") & (t["metric"] == "accuracy")]
    assert len(acc) == 4 * 2 and set(acc["split"]) == {"dev", "test"}
    ate = t[(t["kind"] == "ate") & (t["aspect"] == "food") & (t["direction"] == "Neg→Pos")]
    assert (ate["value"] > 0).all() and ate.groupby("cebab_task")["value"].nunique().eq(1).all()  # data: no seed
    # aggregate the sweep
    sweep = runs[0].parent
    r = cprobe("collect", str(sweep), cwd=tmp_path, data=world[0])
    assert r.returncode == 0, r.stderr[-2000:]
    table = pd.read_csv(sweep / "cebab_icace_error.csv")
    assert set(table["cebab_task"]) == {"2way", "5way"}
    assert table.filter(like="random").iloc[0, 0].count("(") == 1  # "mean (std)" cells over the two seeds
    assert list(sweep.glob("cebab_icace_error_*.png"))
