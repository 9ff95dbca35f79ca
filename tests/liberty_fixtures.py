"""A tiny LIBERTy SCM (with a phrase bank) and a tiny BERT encoder over its words, written by the tests."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

SCM = {
    "name": "tiny", "title": "Tiny", "label": "y", "null_value": "none",
    "variables": {
        "a": {"values": ["none", "some"], "distribution": "uniform"},
        "b": {"values": ["none", "some"], "terms": {"a": 0.8}, "noise": {"mean": 0.0, "sd": 0.4}},
        "c": {"values": ["none", "blue", "green"], "distribution": [0.4, 0.3, 0.3]},
        "y": {"values": ["no", "yes"], "terms": {"b": 0.7, "c=blue": 0.5}, "noise": {"mean": 0.0, "sd": 0.3}},
    },
    "text": {
        "expresses": ["a", "b", "c"],
        "openings": ["hello there .", "good day ."],
        "closings": ["bye now .", "that is all ."],
        "personas": ["i like tea .", "i like cats .", "i walk a lot ."],
        "phrases": {
            "a": {"none": ["no alpha here .", "alpha is absent ."], "some": ["alpha is present .", "some alpha ."]},
            "b": {"none": ["no beta here .", "beta is absent ."], "some": ["beta is strong .", "much beta ."]},
            "c": {"none": ["no colour .", "colour is absent ."], "blue": ["it is blue .", "blue colour ."],
                  "green": ["it is green .", "green colour ."]},
        },
    },
}


def write_scm(path: Path) -> Path:
    path.write_text(yaml.safe_dump(SCM, sort_keys=False))
    return path


def tiny_encoder_dir(path: Path) -> Path:
    from transformers import BertConfig, BertModel

    from cprobe.models.tiny import build_tokenizer

    t = SCM["text"]
    sentences = [*t["openings"], *t["closings"], *t["personas"],
                 *(s for bank in t["phrases"].values() for v in bank.values() for s in v)]
    tok = build_tokenizer("bert", sorted({w for s in sentences for w in s.split()}), 64)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


def metric_value(metrics, kind: str, explainer: str, **where):
    """The one value of a LIBERTy metric table row of ``kind`` and ``explainer`` (and the columns in ``where``)."""
    m = (metrics["kind"] == kind) & (metrics["explainer"] == explainer)
    for k, v in where.items():
        m &= metrics[k] == v
    (v,) = metrics[m]["value"]
    return v


def check_pair_effects(job: Path, explainers: tuple[str, ...] = ("ft_match", "approx", "tcav")) -> None:
    """A finished LIBERTy job's numbers recomputed from its per-pair file: the true ICaCE = cf − base probabilities,
    each named explainer's error distances (and their mean), order-faithfulness and global OF, the model's
    sensitivity per concept."""
    import numpy as np
    import pandas as pd
    import pytest

    from cprobe.metrics import liberty as M

    pairs = pd.read_parquet(job / "liberty_pair_effects.parquet")
    true = np.stack(pairs["icace"])
    np.testing.assert_allclose(true, np.stack(pairs["cf_probs"]) - np.stack(pairs["base_probs"]), atol=1e-12)
    mine = pd.read_parquet(job / "metrics.parquet")

    def value(kind, explainer, **kw):
        return metric_value(mine, kind, explainer, **kw)

    for ex in explainers:
        est = np.stack(pairs[f"estimate_{ex}"])
        eds = [M.error_distance(true, est, pairs["change"], d) for d in ("l2", "cosine", "normdiff")]
        assert value("ed", ex, distance="l2") == pytest.approx(eds[0])
        assert value("ed", ex, distance="mean") == pytest.approx(np.mean(eds))
        assert value("of", ex) == pytest.approx(M.order_faithfulness(true, est, pairs["example"], pairs["change"]))
        gold = M.importance(true, pairs["concept"], pairs["change"])
        assert value("global_of", ex) == pytest.approx(
            M.global_order_faithfulness(gold, M.importance(est, pairs["concept"], pairs["change"])))
    sens = M.sensitivity(true, pairs["concept"])
    assert len(sens) > 0
    for c, s in sens.items():
        assert value("sensitivity", "model", concept=c) == pytest.approx(s)
