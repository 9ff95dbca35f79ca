"""The LM head at the candidates only (issue 53): a candidate readout's pass with the full head against the same pass
computing only the candidates' rows of the head (:mod:`cprobe.models.head`), in one process.

Shapes (random init from the config: no download): ``gemma3_270m`` — Gemma 3 270M (18 blocks, d = 640, 5
sliding-window layers to 1 global, a tied 262,144-token head: more parameters than its blocks); ``gpt2`` — GPT-2 small
(12 blocks, d = 768, a 50,257-token head); ``tiny`` for a smoke run. Work, per shape: ``--n`` CausalGym-style pairs
(sentences of the agreement grammar, word-level tokenizer); the base's state at layer ``--layer`` at its prediction
position is moved along a fixed unit direction to the source's (the 1-D interchange), and the two candidates (the
correct and the wrong verb form) are read there:

- **interchange**: the full forward (the head at the scored position only, as since issue 35);
- **interchange, resumed+KV**: the same pass resumed at the layer over the prefix's clean key/value cache, the last
  token alone above it — how CausalGym scores its last-region rows, where the head is most of what is left.

Each runs with ``adapter.head_rows = False`` (the full head: V logits per row, the k candidates gathered — the code
before issue 53) and ``True`` (k rows of the head), interleaved, ``--repeats`` rounds, the median reported; ratio = the
full head's time ÷ the candidate rows' (above 1: faster). Before timing the two scores are checked equal (≤ 1e-5).
Then torch's profiler runs each pass once and reports the share of its CPU time spent in the head (the head module's
forward, or :meth:`Head.rows <cprobe.models.head.Head.rows>`), before and after.

- **DAS steps, resumed+KV** (``--das-steps``, default 8): CausalGym's DAS training at ``--sites`` sites of the last
  token (one batched :class:`~cprobe.models.multisite.SitesForward`, DAS's batch of 4 rows, so K·4 rows a step), whose
  loss needs the normaliser: the full head (``head_rows = False``: the (K·4, V) logits, their log-softmax, forward and
  backward) against the target's row and the streamed normaliser (:meth:`Head.log_probs
  <cprobe.models.head.Head.log_probs>`, one read of the head for the value and its gradient). Time per fit; the two
  fits' directions are checked equal (≤ 1e-4: a few Adam steps amplify float rounding). No head share (the
  profiler's hooks cannot see the head's backward).

    python scripts/bench_head.py --shapes gemma3_270m --das-steps 16 --repeats 3 --skip-passes   # DAS only

    python scripts/bench_head.py                                   # Gemma 3's shape and GPT-2's (docs/performance.md)
    python scripts/bench_head.py --shapes gemma3_270m --threads 1 --repeats 5
    python scripts/bench_head.py --shapes tiny --n 8 --repeats 1   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Interchange
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from cprobe.models.tiny import build_tokenizer

SHAPES = {
    # Gemma 3 270M (its GGUF's config: model=gemma3_270m), as scripts/bench_peers.py builds it
    "gemma3_270m": ("gemma3", dict(num_hidden_layers=18, hidden_size=640, intermediate_size=2048,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                   sliding_window=512, query_pre_attn_scalar=256)),
    "gpt2": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)),
    "tiny": ("gemma3", dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, vocab_size=4096, sliding_window=512)),
}
TOL = 1e-5


def build(shape: str, n: int) -> tuple[ModelAdapter, list, list]:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

    family, cfg = SHAPES[shape]
    ex = generate(GrammarConfig(n_sentences=4 * n, seed=1)).examples
    tok = build_tokenizer("neox", vocabulary(GrammarConfig(n_sentences=4 * n, seed=0)), 128)
    torch.manual_seed(0)
    if family == "gemma3":
        # the tokenizer's padding id as the embedding's padding index, as scripts/bench_peers.py does
        model = Gemma3ForCausalLM(Gemma3TextConfig(max_position_embeddings=128, pad_token_id=tok.pad_token_id, **cfg))
    else:
        model = GPT2LMHeadModel(GPT2Config(n_positions=128, **cfg))
    adapter = ModelAdapter(model.eval(), tok, "causal", shape, batch_size=32)
    return adapter, ex[:n], [ex[n + (i * 7) % n] for i in range(n)]


def passes(adapter: ModelAdapter, base: list, source: list, layer: int) -> dict:
    """name -> a callable running that pass and returning its scores (n, 2)."""
    fmt = AgreementFormatter()
    site = Site(layer)
    src = adapter.map(source, fmt, read=[site]).acts[site]
    a = torch.nn.functional.normalize(torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(0)),
                                      dim=0)
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in base])
    edits = {site: Interchange(src, a)}
    clean = adapter.clean_states(fmt(base, adapter, torch.arange(len(base))), [layer], kv=True)
    return {"interchange": lambda: adapter.map(base, fmt, edits=edits, readout=cands).scores,
            "interchange, resumed+KV": lambda: adapter.map(base, fmt, edits=edits, readout=cands,
                                                           resume=clean).scores}


def das_fit(adapter: ModelAdapter, base: list, source: list, layer: int, sites: int, steps: int):
    """A callable training DAS for ``steps`` steps at ``sites`` sites of the last token (layers ``layer`` and below),
    resumed at the lowest over the prefix's key/value cache, as CausalGym's DAS does; returns the directions (K, d)."""
    from cprobe.directions.das import DAS
    from cprobe.models.multisite import SitesForward

    fmt = AgreementFormatter()
    site_list = [Site(max(1, layer - k)) for k in range(sites)]
    src = adapter.map(source, fmt, read=site_list).acts
    h = torch.stack([src[s] for s in site_list])
    n = min(len(base), 4 * steps)
    batch = fmt(base[:n], adapter, torch.arange(n))
    target = torch.tensor([adapter.candidate_id(e.wrong) for e in base[:n]]).repeat(sites, 1)
    clean = adapter.clean_states(batch, [min(s.layer for s in site_list)], kv=True)
    das = DAS(batch_size=4)

    def run():
        forward = SitesForward(adapter, batch, torch.arange(n), site_list, das.windows(n), clean)
        return das.fit_many(forward, h[:, :n], target)
    return run


def with_head(adapter: ModelAdapter, rows: bool, run):
    adapter.head_rows = rows
    try:
        return run()
    finally:
        adapter.head_rows = True


def timed(adapter: ModelAdapter, run, repeats: int) -> tuple[float, float]:
    """(full head, split head): median seconds of ``run`` over ``repeats`` interleaved rounds."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for flag in (False, True):
            t0 = time.perf_counter()
            with_head(adapter, flag, run)
            times[flag].append(time.perf_counter() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def head_share(adapter: ModelAdapter, rows: bool, run) -> float:
    """The share of the pass's profiled CPU time spent in the head: the head module's forward (full), or the
    candidates' rows (:meth:`Head.rows`)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    spans: list = []
    handles = []
    head = adapter.head
    if rows:
        plain = head.rows

        def timed(x, ids):
            with record_function("head"):
                return plain(x, ids)
        head.rows = timed
    else:
        def enter(*_):
            spans.append(record_function("head"))
            spans[-1].__enter__()

        def leave(*_):
            spans.pop().__exit__(None, None, None)
        handles = [adapter._head.register_forward_pre_hook(enter), adapter._head.register_forward_hook(leave)]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("pass"):
                with_head(adapter, rows, run)
    finally:
        for h in handles:
            h.remove()
        if rows:
            del head.rows
    took = {e.key: e.cpu_time_total for e in prof.key_averages() if e.key in ("head", "pass")}
    return took.get("head", 0.0) / took["pass"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="gemma3_270m,gpt2", help=f"comma-separated, of {sorted(SHAPES)}")
    ap.add_argument("--n", type=int, default=64, help="pairs")
    ap.add_argument("--layer", type=int, default=None, help="the edited layer (default: two thirds of the depth)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--das-steps", type=int, default=8, help="DAS steps per timed fit (0: no DAS row)")
    ap.add_argument("--sites", type=int, default=4, help="DAS sites trained together (K)")
    ap.add_argument("--skip-passes", action="store_true", help="only the DAS row")
    args = ap.parse_args()
    if args.das_steps and args.n < 4 * args.das_steps:
        ap.error(f"--das-steps {args.das_steps} trains on 4 rows a step: it needs --n >= {4 * args.das_steps} pairs")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.n} pairs, median of {args.repeats}")
    print("| shape | vocabulary | pass | full head, s | candidate rows, s | ratio | head share: full → rows |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        adapter, base, source = build(shape, args.n)
        assert adapter.head is not None, f"{shape}: no split head"
        layer = args.layer or (2 * adapter.n_layers) // 3
        V = adapter.head.projection.weight.shape[0]
        if args.das_steps:
            run = das_fit(adapter, base, source, layer, args.sites, args.das_steps)
            full, rows = with_head(adapter, False, run), with_head(adapter, True, run)
            err = float((full - rows).abs().max())
            if err > 1e-4:
                raise SystemExit(f"{shape} DAS: the streamed loss's directions differ from the full head's by "
                                 f"{err:.2e}")
            t_full, t_rows = timed(adapter, run, args.repeats)
            print(f"| {shape} | {V:,} | DAS, {args.das_steps} steps × {4 * args.sites} rows, resumed+KV (layers "
                  f"{max(1, layer - args.sites + 1)}–{layer}) | {t_full:.3f} | {t_rows:.3f} | "
                  f"**{t_full / t_rows:.2f}×** | — |",
                  flush=True)
        for name, run in ({} if args.skip_passes else passes(adapter, base, source, layer)).items():
            full, rows = with_head(adapter, False, run), with_head(adapter, True, run)
            err = float((full - rows).abs().max())
            if err > TOL * max(1.0, float(full.abs().max())):
                raise SystemExit(f"{shape} {name}: candidate rows differ from the full head by {err:.2e}")
            t_full, t_rows = timed(adapter, run, args.repeats)
            share = (head_share(adapter, False, run), head_share(adapter, True, run))
            print(f"| {shape} | {V:,} | {name} (layer {layer}) | {t_full:.3f} | {t_rows:.3f} | "
                  f"**{t_full / t_rows:.2f}×** | {100 * share[0]:.1f} % → {100 * share[1]:.2f} % |", flush=True)
        del adapter


if __name__ == "__main__":
    main()
