"""Extraction throughput: cprobe's adapter vs a bare `model(**batch)` loop vs one sentence at a time.

Same model, same examples, same batches; prints sentences/s and ratios (target: cprobe ≥ 0.8× bare).
Default model: a random-init BERT of bert-base shape (no download). `--model-dir` benchmarks a saved
HF model instead; `--dtype bfloat16` for bf16 (never fp16 on CPU).

    python scripts/bench_extract.py [--n 512] [--batch-size 32] [--layers 4] [--size base|tiny]
"""

from __future__ import annotations

import argparse
import time

import torch

from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.sites import Site
from cprobe.models.tiny import build_tokenizer


def _model(args):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

    if args.model_dir:
        return (AutoModelForMaskedLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype)),
                AutoTokenizer.from_pretrained(args.model_dir))
    tok = build_tokenizer("bert", vocabulary(GrammarConfig(n_sentences=args.n, seed=0)), 64)
    size = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072) \
        if args.size == "base" else dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=512)
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=len(tok), max_position_embeddings=64, **size)).to(
        getattr(torch, args.dtype)).eval(), tok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", choices=["base", "tiny"], default="base")
    p.add_argument("--model-dir", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one-at-a-time", type=int, default=64, help="sentences for the unbatched baseline")
    args = p.parse_args()

    model, tok = _model(args)
    ad = ModelAdapter(model, tok, "mlm", "bench", batch_size=args.batch_size)
    examples = generate(GrammarConfig(n_sentences=args.n, seed=0)).examples
    sites = [Site(layer) for layer in range(ad.n_layers + 1)]
    fmt = AgreementFormatter()
    # identical (length-sorted) batches for the bare loop
    order = sorted(range(len(examples)), key=lambda i: fmt.length(examples[i]), reverse=True)
    chunks = [order[i: i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    batches = [fmt([examples[i] for i in c], ad, torch.tensor(c)) for c in chunks]

    def bare():
        with torch.inference_mode():
            for b in batches:
                model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)

    def ours():
        ad.map(examples, fmt, read=sites)

    def single():
        with torch.inference_mode():
            for i, e in enumerate(examples[: args.one_at_a_time]):
                b = fmt([e], ad, torch.tensor([i]))
                model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)

    bare()  # warm-up
    res: dict[str, float] = {}
    runs = (("bare model(**batch)", bare, len(examples)), ("cprobe map", ours, len(examples)),
            ("one sentence at a time", single, min(args.one_at_a_time, len(examples))))
    for _ in range(args.repeats):  # interleaved repeats, best of each: robust to a noisy machine
        for name, fn, n in runs:
            t0 = time.perf_counter()
            fn()
            res[name] = max(res.get(name, 0.0), n / (time.perf_counter() - t0))
    base = res["bare model(**batch)"]
    print(f"model: {args.model_dir or args.size} ({args.dtype}), n={len(examples)}, batch={args.batch_size}, "
          f"threads={torch.get_num_threads()}")
    for name, sps in res.items():
        print(f"  {name:<24} {sps:9.1f} sent/s   ratio vs bare: {sps / base:5.2f}")
    print(f"cprobe / bare = {res['cprobe map'] / base:.2f} (target ≥ 0.8); "
          f"cprobe / one-at-a-time = {res['cprobe map'] / res['one sentence at a time']:.1f}×")


if __name__ == "__main__":
    main()
