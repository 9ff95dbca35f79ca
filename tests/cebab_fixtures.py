"""Small CEBaB-format files written by tests (never the shared data): a few units, each an original review and
aspect edits, whose sentiment words decide the labels, so a tiny model can learn them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = {"food": {"Positive": "tasty food", "Negative": "awful food"},
         "service": {"Positive": "kind staff", "Negative": "rude staff"},
         "ambiance": {"Positive": "lovely room", "Negative": "ugly room"},
         "noise": {"Positive": "quiet place", "Negative": "loud place"}}
ASPECTS = ("food", "service", "ambiance", "noise")


def _text(labels: dict[str, str]) -> str:
    parts = [WORDS[a][v] for a, v in labels.items() if v in ("Positive", "Negative")]
    return ("we went there . " + " and ".join(parts) + " .") if parts else "we went there ."


def _rating(labels: dict[str, str]) -> str:
    score = sum({"Positive": 1, "Negative": -1}.get(v, 0) * (2 if a == "food" else 1) for a, v in labels.items())
    return str(min(5, max(1, 3 + score)))


def record(oid: int, eid: int, labels: dict[str, str], edit_type: str | None, goal: str | None,
           rating: str | None = None) -> dict:
    rec = {"id": f"{oid:06d}_{eid:06d}", "original_id": f"{oid:06d}", "edit_id": f"{eid:06d}",
           "is_original": edit_type is None, "edit_goal": goal, "edit_type": edit_type, "edit_worker": None,
           "description": _text(labels), "review_majority": rating or _rating(labels)}
    for a in ASPECTS:
        rec[f"{a}_aspect_majority"] = labels.get(a, "")
    return rec


def unit(oid: int, labels: dict[str, str], edits: list[tuple[str, str]]) -> list[dict]:
    out = [record(oid, 0, labels, None, None)]
    for j, (aspect, goal) in enumerate(edits, 1):
        out.append(record(oid, j, {**labels, aspect: goal}, aspect, goal))
    return out


def write_cebab(root: Path, n_train: int = 60, n_eval: int = 12) -> Path:
    """``root/cebab/{train_exclusive,train_inclusive,train_observational,dev,test}.json``."""
    import itertools

    combos = list(itertools.product(("Positive", "Negative", "unknown"), repeat=4))
    d = Path(root) / "cebab"
    d.mkdir(parents=True, exist_ok=True)

    def units(start: int, n: int, with_edits: bool) -> list[dict]:
        recs = []
        for i in range(n):
            labels = dict(zip(ASPECTS, combos[(start + 7 * i) % len(combos)]))
            edits = []
            if with_edits:
                a = ASPECTS[i % 4]
                edits = [(a, v) for v in ("Positive", "Negative", "unknown") if v != labels[a]]
            recs += unit(start + i, labels, edits)
        return recs

    train = units(0, n_train, False)
    train += units(1000, n_train, True)
    for name in ("train_exclusive", "train_inclusive", "train_observational"):
        (d / f"{name}.json").write_text(json.dumps(train))
    (d / "dev.json").write_text(json.dumps(units(2000, n_eval, True)))
    (d / "test.json").write_text(json.dumps(units(3000, n_eval, True)))
    return d


def tiny_encoder_dir(path: Path) -> Path:
    """A tiny BERT encoder + word-level tokenizer over the fixture's vocabulary, saved as a HF checkpoint."""
    from transformers import BertConfig, BertModel

    from cprobe.models.tiny import build_tokenizer

    words = {w for a in WORDS.values() for t in a.values() for w in t.split()} | {"we", "went", "there", ".", "and"}
    tok = build_tokenizer("bert", sorted(words), 64)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


def check_pair_effects(job: Path, explainers: tuple[str, ...] = ("approx", "tcav")) -> None:
    """A finished CEBaB job's numbers recomputed from its per-pair file: the true ICaCE = N(φ(x_cf)) − N(φ(x_base)),
    each named explainer's ICaCE-Error per distance, the model's CaCE (argmax class) per aspect and direction."""
    import numpy as np
    import pandas as pd
    import pytest

    from cprobe.metrics.icace import cosine, l2, normdiff

    pairs = pd.read_parquet(job / "cebab_pair_effects.parquet")
    true = np.stack(pairs["icace"])
    np.testing.assert_allclose(true, np.stack(pairs["cf_probs"]) - np.stack(pairs["base_probs"]), atol=1e-12)
    mine = pd.read_parquet(job / "metrics.parquet")
    for name, fn in (("l2", l2), ("cosine", cosine), ("normdiff", normdiff)):
        for ex in explainers:
            row = mine[(mine["kind"] == "icace_error") & (mine["explainer"] == ex) & (mine["distance"] == name)
                       & (mine["aspect"] == "all")]
            assert row["value"].iloc[0] == pytest.approx(fn(true, np.stack(pairs[f"estimate_{ex}"])).mean())
    shift = pairs["sign"] * (np.stack(pairs["cf_probs"]).argmax(1) - np.stack(pairs["base_probs"]).argmax(1))
    expected = shift.groupby([pairs["aspect"], pairs["direction"]]).mean()
    cace = mine[mine["kind"] == "cace"].dropna(subset=["value"]).set_index(["aspect", "direction"])["value"]
    assert len(expected) > 0
    for key, v in expected.items():
        assert cace[key] == pytest.approx(v)
