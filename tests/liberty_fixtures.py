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
