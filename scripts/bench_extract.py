"""Extraction throughput: cprobe's engine (`ModelAdapter.map`) against a bare `model(**batch)` loop, same model, same
sentences, same length-sorted batches, in one process.

For each model shape (random init from its config: no download) prints sentences/s, tokens/s, MFU and the ratio to
the bare forward for (a) reading every layer at the prediction position and (b) reading one early layer (the forward
stops there). Targets: CPU every layer ≥ 0.95× bare, early layer ≥ 1.5×; GPU (H100-class, bf16, token-budget
batches) every layer ≥ 0.9×, early layer ≥ 1.5×. MFU: model flops (2 × non-embedding parameters per token + attention)
over the peak — on a GPU the datasheet's dense peak for its dtype (`--peak-tflops` to set it), on a CPU a large
matmul measured in the same process.

    python scripts/bench_extract.py --device cuda --dtype bfloat16            # bert-base, pythia-410m, pythia-1.4b
    python scripts/bench_extract.py --device cpu --shapes bert-base --n 256   # small n on CPU
    python scripts/bench_extract.py --size tiny --n 32                        # a smoke run
"""

from __future__ import annotations

import argparse
import time

import torch

from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.models.adapter import ModelAdapter
from cprobe.models.batching import plan_batches
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.sites import Site
from cprobe.models.tiny import build_tokenizer

SHAPES = {
    "bert-base": ("bert", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                               vocab_size=30522)),
    "pythia-410m": ("neox", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096, vocab_size=50304)),
    "pythia-1.4b": ("neox", dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=8192, vocab_size=50304)),
    "tiny": ("bert", dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                          vocab_size=512)),
}
# dense peak TFLOP/s by GPU name fragment: (bf16/fp16 tensor cores, fp32 via TF32 tensor cores)
PEAKS = {"H200": (989, 495), "H100": (989, 495), "A100": (312, 156), "L40S": (362, 183), "A10": (125, 62.5),
         "L4": (121, 60), "V100": (125, 15.7), "T4": (65, 8.1), "RTX 4090": (165, 82.6)}


def build(shape: str, dtype: torch.dtype, device: torch.device, n: int):
    from transformers import BertConfig, BertForMaskedLM, GPTNeoXConfig, GPTNeoXForCausalLM

    arch, size = SHAPES[shape]
    tok = build_tokenizer(arch, vocabulary(GrammarConfig(n_sentences=n, seed=0)), 128)
    torch.manual_seed(0)
    with torch.device(device):
        if arch == "bert":
            model = BertForMaskedLM(BertConfig(max_position_embeddings=128, **size))
        else:
            model = GPTNeoXForCausalLM(GPTNeoXConfig(max_position_embeddings=128, **size))
    return model.to(dtype).eval(), tok, "mlm" if arch == "bert" else "causal"


def flops_per_token(model, seq: float) -> float:
    cfg = model.config
    emb = sum(p.numel() for n, p in model.named_parameters() if "embed" in n)
    dense = sum(p.numel() for p in model.parameters()) - emb
    return 2 * dense + 4 * cfg.num_hidden_layers * seq * cfg.hidden_size


def peak_flops(device: torch.device, dtype: torch.dtype, given: float | None) -> tuple[float, str]:
    if given:
        return given * 1e12, f"given {given} TFLOP/s"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for frag, (half, full) in PEAKS.items():
            if frag in name:
                p = half if dtype != torch.float32 else full
                return p * 1e12, f"{name} datasheet {p} TFLOP/s"
    a = torch.randn(2048, 2048, dtype=dtype, device=device)
    a @ a
    sync(device)
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < 1.0:
        a @ a
        k += 1
    sync(device)
    p = k * 2 * 2048 ** 3 / (time.perf_counter() - t0)
    return p, f"measured 2048² matmul {p / 1e12:.3f} TFLOP/s"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_shape(shape: str, args, device: torch.device, dtype: torch.dtype) -> None:
    examples = generate(GrammarConfig(n_sentences=args.n, seed=0)).examples
    model, tok, kind = build(shape, dtype, device, args.n)
    ad = ModelAdapter(model, tok, kind, shape, batch_size=args.batch_size, batch_tokens=args.batch_tokens)
    fmt = AgreementFormatter()
    enc = fmt.encode(examples, ad)
    plan = plan_batches(enc.lengths, args.batch_size, args.batch_tokens)
    batches = [enc.batch(idx).to(device) for idx in plan]  # the bare loop gets its batches ready on the device
    tokens = int(enc.lengths.sum())
    early = min(args.layer, ad.n_layers)

    def bare():
        with torch.inference_mode():
            for b in batches:
                model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)
        sync(device)

    def every():
        ad.map(examples, fmt, read=[Site(layer) for layer in range(ad.n_layers + 1)], dtype=dtype)
        sync(device)

    def one():
        ad.map(examples, fmt, read=[Site(early)], dtype=dtype)
        sync(device)

    bare()
    every()  # warm-up
    runs = {"bare model(**batch)": bare, "cprobe, every layer": every, f"cprobe, layer {early} only": one}
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # interleaved repeats, best of each: robust to a noisy machine
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    seq = tokens / len(examples)
    fpt = flops_per_token(model, seq)
    peak, peak_note = peak_flops(device, dtype, args.peak_tflops)
    base = best["bare model(**batch)"]
    print(f"\n{shape} ({str(dtype).removeprefix('torch.')}, {device}): n={len(examples)}, {len(batches)} batches "
          f"(batch_size={args.batch_size}, batch_tokens={args.batch_tokens}), {seq:.1f} tokens/sentence, "
          f"threads={torch.get_num_threads()}; peak: {peak_note}")
    for name, s in best.items():
        # the bare loop runs every layer and the head; an early stop runs a fraction of the model (MFU counts that)
        share = (early / ad.n_layers) if "only" in name else 1.0
        mfu = tokens * fpt * share / s / peak
        print(f"  {name:<24} {len(examples) / s:10.1f} sent/s {tokens / s:12.1f} tokens/s  MFU {mfu:6.1%}  "
              f"ratio vs bare: {base / s:5.2f}")
    print(f"  every layer / bare = {base / best['cprobe, every layer']:.2f} (target ≥ "
          f"{0.9 if device.type == 'cuda' else 0.95}); layer {early} / bare = {base / best[runs_key(early)]:.2f} "
          "(target ≥ 1.5)")


def runs_key(early: int) -> str:
    return f"cprobe, layer {early} only"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:<i>")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--shapes", default=None, help="comma-separated from " + ", ".join(SHAPES)
                   + " (default: the three real shapes on CUDA, bert-base on CPU)")
    p.add_argument("--size", choices=["base", "tiny"], default=None, help="old spelling: base = bert-base, tiny")
    p.add_argument("--n", type=int, default=None, help="sentences (default 4096 on CUDA, 256 on CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="rows per batch (default 512 on CUDA, 32 on CPU)")
    p.add_argument("--batch-tokens", type=int, default=None, help="padded tokens per batch (default 32768 on CUDA)")
    p.add_argument("--layer", type=int, default=4, help="the early layer")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--one-at-a-time", type=int, default=0, help="(ignored; kept for old command lines)")
    args = p.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    if not cuda and dtype == torch.bfloat16:
        from cprobe.compute import cpu_bf16

        if not cpu_bf16():
            print("note: this CPU has no native bf16; bf16 numbers here are not what cprobe would run")
    args.n = args.n or (4096 if cuda else 256)
    args.batch_size = args.batch_size or (512 if cuda else 32)
    if args.batch_tokens is None and cuda:
        args.batch_tokens = 32768
    shapes = args.shapes.split(",") if args.shapes else (
        [{"base": "bert-base", "tiny": "tiny"}[args.size]] if args.size else
        (["bert-base", "pythia-410m", "pythia-1.4b"] if cuda else ["bert-base"]))
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(device) if cuda else 'cpu'}")
    for shape in shapes:
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
        bench_shape(shape, args, device, dtype)


if __name__ == "__main__":
    main()
