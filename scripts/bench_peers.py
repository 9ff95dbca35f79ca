"""cprobe against its peers — TransformerLens, nnsight, pyvene — and a bare Hugging Face forward, in one process.

GPT-2-small shape with random weights (built from ``GPT2Config``: no download; ``--size gemma3_270m``: Gemma 3 270M's
shape, from ``Gemma3TextConfig``: 18 blocks, 5 sliding-window layers to 1 global, a 262,144-token tied head — the
peers are GPT-2-only here, so that shape compares cprobe with the floor), sentences of the agreement grammar
(word-level tokenizer), float32, ``--threads`` intra-op threads, interleaved repeats (every tool once per round; the
median is reported). Rows:

- **every layer at one position**: the state of every layer (0 … 12, HF ``output_hidden_states``) at the prediction
  position of 128 sentences;
- **one early layer (3 of 12)**: the same for layer 3 alone (a tool may stop the forward there);
- **1-D interchange along a fixed direction at layer 6**: 128 CausalGym-style (base, source) pairs; the source's
  layer-6 state at its prediction position is read, the base's is moved along a fixed unit direction ``a`` to it
  (``h + ((s − h)·a) a``), and the two candidate tokens' log-probabilities are read at the base's prediction position
  (cprobe with ``normalise=True``: the full head, as every tool; a study that compares the candidates reads their
  rows of the head only, ``scripts/bench_head.py``);
- **one DAS training step**: forward, backward and an Adam step of a trainable direction through the same interchange
  on a batch of 32 pairs (the source states read beforehand, as DAS training does).

Both edited rows edit and score the base's prediction position, a causal LM's last token: ``cprobe resumed`` resumes
the pass at the edited layer, ``cprobe resumed+KV`` also runs only that token above it, over the prefix's clean
key/value cache (:mod:`cprobe.models.resume`).

The floor ("bare HF") is what a researcher writes by hand: full forwards with ``output_hidden_states`` and a forward
hook for the edit. ratio = the floor's time ÷ the tool's (above 1: faster than the floor). Memory: the peak resident
memory (on a GPU: peak allocated memory) one run adds. Before any timing each row checks every tool's outputs against
the floor's (≤ 1e-5: states, scores; the DAS step's loss and its gradient relative to the largest entry) and stops on a
mismatch.

    python scripts/bench_peers.py                          # CPU, GPT-2-small shape, 2 threads (docs/performance.md)
    python scripts/bench_peers.py --device cuda --repeats 10
    python scripts/bench_peers.py --size tiny --n 16 --repeats 1   # a smoke run
    python scripts/bench_peers.py --size gemma3_270m --peers '' --rows interchange,das   # Gemma 3 (docs/real_models.md)

The peers are the optional extra ``cprobe[peers]`` (``make bench-peers-install`` keeps the CPU torch); a peer that is
not installed is reported as such and left out.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.models.adapter import ModelAdapter
from cprobe.models.batching import plan_batches
from cprobe.models.edits import Interchange, dii_edit
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens, Readout
from cprobe.models.sites import Site
from cprobe.models.tiny import build_tokenizer

SHAPES = {"small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257),  # GPT-2 small
          "tiny": dict(n_layer=4, n_embd=64, n_head=2, vocab_size=1000),
          # Gemma 3 270M (its GGUF's config: model=gemma3_270m), the layer pattern and window as transformers sets them
          "gemma3_270m": dict(family="gemma3", num_hidden_layers=18, hidden_size=640, intermediate_size=2048,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                              sliding_window=512, query_pre_attn_scalar=256)}
TOL = 1e-5
BATCH = 32  # rows per forward for every tool (length-sorted), and the DAS step's batch


# ----------------------------------------------------------------------------------------------- setup
def build(size: str, device: torch.device, n: int):
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

    tok = build_tokenizer("neox", vocabulary(GrammarConfig(n_sentences=4 * n, seed=0)), 128)
    d = tempfile.mkdtemp(prefix="bench_peers_tok_")
    tok.save_pretrained(d)  # TransformerLens re-reads the tokenizer by its name_or_path
    tok = AutoTokenizer.from_pretrained(d)
    torch.manual_seed(0)
    shape = dict(SHAPES[size])
    if shape.pop("family", "gpt2") == "gemma3":
        # the tokenizer's padding id as the embedding's padding index (zero row): Gemma's default 0 is this
        # tokenizer's <|endoftext|>, every input's start token, whose zero embedding gives NaN gradients
        model = Gemma3ForCausalLM(Gemma3TextConfig(max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                                                   **shape)).to(device).eval()
    else:
        model = GPT2LMHeadModel(GPT2Config(n_positions=128, **shape)).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def items(n: int):
    ex = generate(GrammarConfig(n_sentences=4 * n, seed=1)).examples
    base = ex[:n]
    source = [ex[n + (i * 7) % n] for i in range(n)]  # the CausalGym-style pair's source: another sentence
    return base, source


class Batches:
    """The same length-sorted batches of right-padded ids and prediction positions for every tool."""

    def __init__(self, adapter: ModelAdapter, examples, device: torch.device) -> None:
        enc = AgreementFormatter().encode(examples, adapter)
        self.batches = [enc.batch(idx, rows=idx).to(device) for idx in plan_batches(enc.lengths, BATCH, None)]
        self.n = len(examples)

    def __iter__(self):
        for b in self.batches:
            yield b.rows, b.input_ids, b.attention_mask, b.position("target")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMemory:
    """Peak memory added while the block runs: resident set size sampled every 2 ms (CPU), or the CUDA allocator's
    peak (GPU). MiB."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.added = device, 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.base = self.peak = self._rss()
        self.stop = threading.Event()

        def watch():
            while not self.stop.is_set():
                self.peak = max(self.peak, self._rss())
                time.sleep(0.002)

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.added = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
            return
        self.stop.set()
        self.thread.join()
        self.added = (max(self.peak, self._rss()) - self.base) / 2**20


# ----------------------------------------------------------------------------------------------- the tools
def dii(h: torch.Tensor, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return h + ((s - h) * a).sum(-1, keepdim=True) * a


class Bare:
    """The floor: plain HF forwards (``output_hidden_states``) and a forward hook on the block for the edit."""

    name = "bare HF"

    def __init__(self, model, L: int) -> None:
        self.model, self.L = model, L
        base = model.base_model
        self.blocks = base.h if hasattr(base, "h") else base.layers  # GPT-2's, Gemma's

    def every(self, data: Batches) -> torch.Tensor:
        out = torch.zeros(data.n, self.L + 1, self.model.config.hidden_size)
        with torch.inference_mode():
            for rows, ids, mask, pos in data:
                hs = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
                r = torch.arange(len(ids), device=ids.device)
                out[rows.cpu()] = torch.stack([h[r, pos] for h in hs], 1).float().cpu()
        return out

    def one(self, data: Batches, layer: int) -> torch.Tensor:
        return self.every(data)[:, layer]

    def _edited_logits(self, ids, mask, pos, layer: int, src: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        r = torch.arange(len(ids), device=ids.device)

        def hook(_m, _i, out):
            h = out[0] if isinstance(out, tuple) else out
            new = h.index_put((r, pos), dii(h[r, pos], src, a))
            return (new, *out[1:]) if isinstance(out, tuple) else new

        handle = self.blocks[layer - 1].register_forward_hook(hook)
        try:
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        finally:
            handle.remove()
        return logits[r, pos]

    def interchange(self, base: Batches, source: Batches, layer: int, a: torch.Tensor, cands: torch.Tensor):
        src = torch.zeros(base.n, self.model.config.hidden_size, device=a.device)
        out = torch.zeros(base.n, cands.shape[1])
        with torch.inference_mode():
            for rows, ids, mask, pos in source:
                hs = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
                src[rows] = hs[layer][torch.arange(len(ids), device=ids.device), pos]
            for rows, ids, mask, pos in base:
                lp = self._edited_logits(ids, mask, pos, layer, src[rows], a).float().log_softmax(-1)
                out[rows.cpu()] = lp.gather(1, cands[rows]).cpu()
        return out

    def das_logits(self, ids, mask, pos, layer, src, a):
        return self._edited_logits(ids, mask, pos, layer, src, a)


class CProbe:
    name = "cprobe"

    def __init__(self, adapter: ModelAdapter, L: int) -> None:
        self.adapter, self.L = adapter, L
        self.fmt = AgreementFormatter()

    def every(self, data) -> torch.Tensor:
        sites = [Site(layer) for layer in range(self.L + 1)]
        acts = self.adapter.map(data.examples, self.fmt, read=sites).acts
        return torch.stack([acts[s] for s in sites], 1)

    def one(self, data, layer: int) -> torch.Tensor:
        return self.adapter.map(data.examples, self.fmt, read=[Site(layer)]).acts[Site(layer)]

    def interchange(self, base, source, layer, a, cands):
        site = Site(layer)
        src = self.adapter.map(source.examples, self.fmt, read=[site]).acts[site]
        return self.adapter.map(base.examples, self.fmt, edits={site: Interchange(src, a)},
                                readout=CandidateTokens(cands.cpu(), normalise=True)).scores

    def das_logits(self, ids, mask, pos, layer, src, a):
        from cprobe.models.sites import Batch

        batch = Batch(ids, mask, {"target": pos}, torch.arange(len(ids), device=ids.device), pred="target")
        # the full-vocabulary log-probabilities at the prediction position: the same loss as every tool's
        out = self.adapter.run(batch, edits={Site(layer): dii_edit(src, a)}, readout=_LOGITS, grad=True)
        return out.scores


class _AllLogits(Readout):
    """The logits (n, V) at the prediction position (DAS's loss is computed from them, as for every tool)."""

    name = "all_logits"

    def scores(self, logits, batch):
        from cprobe.models.readouts import logits_at

        return logits_at(logits, batch)


_LOGITS = _AllLogits()


class CProbeResumed(CProbe):
    """cprobe with the edited passes resumed at the edited layer (``run``/``map`` ``resume=``): the base's clean
    states at the layer come from a clean pass made once, before timing — in a study the clean pass every method and
    direction at that layer shares (CausalGym's base run; in DAS the step windows' fixed base states). Its cost, paid
    once per layer and item set, is printed beside the table (``--rows`` clean)."""

    name = "cprobe resumed"

    def __init__(self, adapter: ModelAdapter, L: int, base_examples, layer: int, das_rows, das_ids, das_mask) -> None:
        super().__init__(adapter, L)
        self.clean = adapter.clean_states(self.fmt(base_examples, adapter, torch.arange(len(base_examples))), [layer])
        das = [base_examples[int(i)] for i in das_rows.cpu()]
        states = adapter.clean_states(self.fmt(das, adapter, torch.arange(len(das))), [layer])
        self.das = states.take(torch.arange(len(das)), das_ids, das_mask, adapter.name, das_ids.device)

    def interchange(self, base, source, layer, a, cands):
        site = Site(layer)
        src = self.adapter.map(source.examples, self.fmt, read=[site]).acts[site]
        return self.adapter.map(base.examples, self.fmt, edits={site: Interchange(src, a)},
                                readout=CandidateTokens(cands.cpu(), normalise=True), resume=self.clean).scores

    def das_logits(self, ids, mask, pos, layer, src, a):
        from cprobe.models.sites import Batch

        batch = Batch(ids, mask, {"target": pos}, torch.arange(len(ids), device=ids.device), pred="target")
        out = self.adapter.run(batch, edits={Site(layer): dii_edit(src, a)}, readout=_LOGITS, grad=True,
                               resume=self.das)
        return out.scores


class CProbeResumedKV(CProbeResumed):
    """``cprobe resumed`` with the prefix's clean key/value cache (``clean_states(kv=True)``): the interchange and
    the DAS step edit and score the base's last token (the prediction position of a causal LM's prefix), so above
    the edited layer that token alone runs, attending to the prefix's clean keys and values."""

    name = "cprobe resumed+KV"

    def __init__(self, adapter: ModelAdapter, L: int, base_examples, layer: int, das_rows, das_ids, das_mask) -> None:
        CProbe.__init__(self, adapter, L)
        self.clean = adapter.clean_states(self.fmt(base_examples, adapter, torch.arange(len(base_examples))), [layer],
                                          kv=True)
        das = [base_examples[int(i)] for i in das_rows.cpu()]
        states = adapter.clean_states(self.fmt(das, adapter, torch.arange(len(das))), [layer], kv=True)
        self.das = states.take(torch.arange(len(das)), das_ids, das_mask, adapter.name, das_ids.device)
        assert self.clean.kv and self.das.kv, "the bench's model family takes no key/value cache"


class TransformerLens:
    name = "TransformerLens"

    def __init__(self, model, tok, L: int, device) -> None:
        from transformer_lens.model_bridge import TransformerBridge

        self.bridge = TransformerBridge.boot_transformers("gpt2", hf_model=model, tokenizer=tok, device=device)
        self.L = L
        self.names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(L - 1)] + \
                     ["ln_final.hook_out"]

    def every(self, data) -> torch.Tensor:
        out = torch.zeros(data.n, self.L + 1, self.bridge.cfg.d_model)
        names = set(self.names)
        with torch.inference_mode():
            for rows, ids, mask, pos in data:
                _, cache = self.bridge.run_with_cache(ids, attention_mask=mask, names_filter=lambda n: n in names)
                r = torch.arange(len(ids), device=ids.device)
                out[rows.cpu()] = torch.stack([cache[n][r, pos] for n in self.names], 1).float().cpu()
        return out

    def one(self, data, layer: int) -> torch.Tensor:
        name = f"blocks.{layer - 1}.hook_resid_post"
        out = torch.zeros(data.n, self.bridge.cfg.d_model)
        with torch.inference_mode():
            for rows, ids, mask, pos in data:
                _, cache = self.bridge.run_with_cache(ids, attention_mask=mask, names_filter=lambda n: n == name,
                                                      stop_at_layer=layer)
                out[rows.cpu()] = cache[name][torch.arange(len(ids), device=ids.device), pos].float().cpu()
        return out

    def _edited_logits(self, ids, mask, pos, layer, src, a):
        r = torch.arange(len(ids), device=ids.device)

        def hook(h, hook):
            return h.index_put((r, pos), dii(h[r, pos], src, a))

        logits = self.bridge.run_with_hooks(ids, attention_mask=mask,
                                            fwd_hooks=[(f"blocks.{layer - 1}.hook_resid_post", hook)])
        return logits[r, pos]

    def interchange(self, base, source, layer, a, cands):
        name = f"blocks.{layer - 1}.hook_resid_post"
        src = torch.zeros(base.n, self.bridge.cfg.d_model, device=a.device)
        out = torch.zeros(base.n, cands.shape[1])
        with torch.inference_mode():
            for rows, ids, mask, pos in source:
                _, cache = self.bridge.run_with_cache(ids, attention_mask=mask, names_filter=lambda n: n == name,
                                                      stop_at_layer=layer)
                src[rows] = cache[name][torch.arange(len(ids), device=ids.device), pos]
            for rows, ids, mask, pos in base:
                lp = self._edited_logits(ids, mask, pos, layer, src[rows], a).float().log_softmax(-1)
                out[rows.cpu()] = lp.gather(1, cands[rows]).cpu()
        return out

    def das_logits(self, ids, mask, pos, layer, src, a):
        return self._edited_logits(ids, mask, pos, layer, src, a)


class NNsight:
    name = "nnsight"

    def __init__(self, model, L: int, stop: bool = False) -> None:
        from nnsight import NNsight as Wrap

        self.m, self.L, self.stop = Wrap(model), L, stop
        self.name = "nnsight (.stop())" if stop else "nnsight"
        self.d = model.config.n_embd

    def every(self, data) -> torch.Tensor:
        out = torch.zeros(data.n, self.L + 1, self.d)
        m = self.m
        with torch.inference_mode():
            for rows, ids, mask, pos in data:
                r = torch.arange(len(ids), device=ids.device)
                saved = []
                with m.trace(input_ids=ids, attention_mask=mask) as tr:
                    saved.append(m.transformer.drop.output[r, pos].save())
                    for i in range(self.L - 1):
                        saved.append(m.transformer.h[i].output[r, pos].save())
                    saved.append(m.transformer.ln_f.output[r, pos].save())
                    if self.stop:
                        tr.stop()
                out[rows.cpu()] = torch.stack(saved, 1).float().cpu()
        return out

    def _read(self, ids, mask, pos, layer):
        m = self.m
        r = torch.arange(len(ids), device=ids.device)
        with m.trace(input_ids=ids, attention_mask=mask) as tr:
            h = m.transformer.h[layer - 1].output[r, pos].save()
            if self.stop:  # the rest of the model is not needed
                tr.stop()
        return h

    def one(self, data, layer: int) -> torch.Tensor:
        out = torch.zeros(data.n, self.d)
        with torch.inference_mode():
            for rows, ids, mask, pos in data:
                out[rows.cpu()] = self._read(ids, mask, pos, layer).float().cpu()
        return out

    def _edited_logits(self, ids, mask, pos, layer, src, a):
        m = self.m
        r = torch.arange(len(ids), device=ids.device)
        with m.trace(input_ids=ids, attention_mask=mask):
            h = m.transformer.h[layer - 1].output
            h[r, pos] = dii(h[r, pos], src, a)
            logits = m.lm_head.output[r, pos].save()
        return logits

    def interchange(self, base, source, layer, a, cands):
        src = torch.zeros(base.n, self.d, device=a.device)
        out = torch.zeros(base.n, cands.shape[1])
        with torch.inference_mode():
            for rows, ids, mask, pos in source:  # two traces: the source's, then the edited base's
                src[rows] = self._read(ids, mask, pos, layer)
            for rows, ids, mask, pos in base:
                lp = self._edited_logits(ids, mask, pos, layer, src[rows], a).float().log_softmax(-1)
                out[rows.cpu()] = lp.gather(1, cands[rows]).cpu()
        return out

    def das_logits(self, ids, mask, pos, layer, src, a):
        return self._edited_logits(ids, mask, pos, layer, src, a)


class Pyvene:
    name = "pyvene"

    def __init__(self, model, layer: int) -> None:
        import pyvene as pv

        holder = self.holder = {}

        class DII(pv.Intervention, pv.DistributedRepresentationIntervention):  # the same 1-D interchange
            def forward(self, base, source, subspaces=None, **kw):
                return dii(base, source, holder["a"])

        self.im = pv.IntervenableModel(pv.IntervenableConfig(
            [{"layer": layer - 1, "component": "block_output", "intervention_type": DII}]), model=model)
        self.im.disable_model_gradients()

    def _pairs(self, base, source):
        """pyvene runs the source and the base in one call: the pairs' batches, padded to one width."""
        for (rows, ids, mask, pos), (srows, sids, smask, spos) in zip(base, source):
            assert torch.equal(rows, srows)
            yield rows, ids, mask, pos, sids, smask, spos

    def _edited_logits(self, ids, mask, pos, sids, smask, spos):
        locs = {"sources->base": ([[[int(p)] for p in spos]], [[[int(p)] for p in pos]])}
        _, out = self.im({"input_ids": ids, "attention_mask": mask},
                         [{"input_ids": sids, "attention_mask": smask}], unit_locations=locs)
        return out.logits[torch.arange(len(ids), device=ids.device), pos]

    def interchange(self, base, source, layer, a, cands):
        self.holder["a"] = a
        out = torch.zeros(base.n, cands.shape[1])
        with torch.inference_mode():
            for rows, ids, mask, pos, sids, smask, spos in self._pairs(base, source):
                lp = self._edited_logits(ids, mask, pos, sids, smask, spos).float().log_softmax(-1)
                out[rows.cpu()] = lp.gather(1, cands[rows]).cpu()
        return out


# ----------------------------------------------------------------------------------------------- rows
def close(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.float().cpu() - y.float().cpu()).abs().max()) if x.numel() else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:<i>")
    ap.add_argument("--size", default="small", choices=sorted(SHAPES))
    ap.add_argument("--n", type=int, default=128, help="sentences / pairs")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--layer", type=int, default=6, help="the interchange's and DAS's layer")
    ap.add_argument("--early", type=int, default=3, help="the one-layer read's layer")
    ap.add_argument("--rows", default="every,one,interchange,das", help="comma-separated subset")
    ap.add_argument("--peers", default="transformer_lens,nnsight,pyvene", help="comma-separated subset ('' none)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    model, tok = build(args.size, device, args.n)
    L = model.config.num_hidden_layers
    layer, early = min(args.layer, L - 1), min(args.early, L - 1)  # block outputs (below the final norm)
    adapter = ModelAdapter(model, tok, "causal", f"{args.size}-random", batch_size=BATCH)
    base_ex, source_ex = items(args.n)
    base, source = Batches(adapter, base_ex, device), Batches(adapter, source_ex, device)
    base.examples, source.examples = base_ex, source_ex
    # the pairs' batches line up (pyvene runs a pair in one call): the source batches follow the base's rows
    source.batches = [AgreementFormatter().encode([source_ex[int(i)] for i in b.rows.cpu()], adapter)
                      .batch(torch.arange(len(b.rows)), rows=b.rows.cpu()).to(device) for b in base.batches]
    cands = torch.tensor([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in base_ex],
                         device=device)
    g = torch.Generator().manual_seed(0)
    a = torch.nn.functional.normalize(torch.randn(model.config.hidden_size, generator=g), dim=0).to(device)

    rows0, ids0, mask0, pos0 = next(iter(base))  # the DAS step's batch: the first 32 pairs
    t0 = time.perf_counter()
    resumed = CProbeResumed(adapter, L, base_ex, layer, rows0, ids0, mask0)
    clean_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    resumed_kv = CProbeResumedKV(adapter, L, base_ex, layer, rows0, ids0, mask0)
    clean_kv_s = time.perf_counter() - t0
    tools: list = [Bare(model, L), CProbe(adapter, L), resumed, resumed_kv]
    missing = []
    wanted = [p for p in args.peers.split(",") if p]
    if wanted and model.config.model_type != "gpt2":
        raise SystemExit(f"the peers' wrappers here are GPT-2's; run --size {args.size} with --peers ''")
    for peer in wanted:  # each peer wraps its own copy of the model (TransformerLens replaces modules in place)
        try:
            if peer == "transformer_lens":
                tools.append(TransformerLens(copy.deepcopy(model), tok, L, device))
            elif peer == "nnsight":
                tools += [NNsight(copy.deepcopy(model), L), NNsight(copy.deepcopy(model), L, stop=True)]
            elif peer == "pyvene":
                tools.append(Pyvene(copy.deepcopy(model), layer))
            else:
                raise SystemExit(f"unknown peer {peer!r}; choose from transformer_lens, nnsight, pyvene")
        except ImportError as e:
            missing.append(f"{peer} ({e.__class__.__name__}: {str(e).splitlines()[0][:80]})")
    versions = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    for mod, dist in (("transformer_lens", "transformer-lens"), ("nnsight", "nnsight"), ("pyvene", "pyvene")):
        try:
            from importlib.metadata import version

            versions[mod] = version(dist)
        except Exception:  # noqa: BLE001 - not installed
            pass

    # the DAS step's batch: the first 32 pairs, their source states read beforehand
    with torch.inference_mode():
        hs = {}
        for rows, ids, mask, pos in source:
            h = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[layer]
            hs[rows] = h[torch.arange(len(ids), device=device), pos]
        src_all = torch.zeros(args.n, model.config.hidden_size, device=device)
        for rows, h in hs.items():
            src_all[rows] = h
    src0 = src_all[rows0].clone()
    target0 = cands[rows0, 1]  # DAS trains toward the source's label

    def das_step(tool) -> tuple[float, torch.Tensor, torch.Tensor]:
        v = torch.nn.Parameter(a.clone())
        opt = torch.optim.Adam([v], lr=5e-3)
        direction = v / v.norm()
        logits = tool.das_logits(ids0, mask0, pos0, layer, src0, direction)
        loss = torch.nn.functional.cross_entropy(logits.float(), target0)
        opt.zero_grad()
        loss.backward()
        grad = v.grad.detach().clone()
        opt.step()
        return float(loss.detach()), grad, v.detach().clone()

    rows_def: dict[str, tuple[str, Callable]] = {
        "every": ("every layer at one position", lambda t: t.every(base)),
        "one": (f"one early layer ({early} of {L})", lambda t: t.one(base, early)),
        "interchange": (f"1-D interchange along a fixed direction at layer {layer}",
                        lambda t: t.interchange(base, source, layer, a, cands)),
        "das": (f"one DAS training step ({BATCH} pairs, layer {layer})", das_step),
    }
    results = []
    for key in [r for r in args.rows.split(",") if r]:
        title, fn = rows_def[key]
        able = [t for t in tools if hasattr(t, {"every": "every", "one": "one", "interchange": "interchange",
                                                  "das": "das_logits"}[key])
                and not (key == "das" and getattr(t, "stop", False))  # nothing to stop in a training step
                and not (key in ("every", "one") and isinstance(t, CProbeResumed))]  # incl. +KV  # reads: nothing to resume
        # equality before timing (also the warm-up)
        ref = fn(able[0])
        for t in able[1:]:
            got = fn(t)
            if key == "das":
                # the loss, and the gradient relative to its largest entry (not the direction after Adam's first
                # step: lr * g / (|g| + eps) turns float noise in near-zero gradient entries into ±lr)
                scale = max(1.0, float(ref[1].abs().max()))
                errs = [abs(got[0] - ref[0]) / max(1.0, abs(ref[0])), close(got[1], ref[1]) / scale]
                err = float("nan") if any(e != e for e in errs) else max(errs)  # a NaN gradient fails (max skips it)
                print(f"  {t.name}: loss {got[0]:.6f} vs {ref[0]:.6f}; gradient {close(got[1], ref[1]):.2e} "
                      f"(largest entry {scale:.2e}); direction after the step {close(got[2], ref[2]):.2e}", flush=True)
            else:
                err = close(got, ref)
            if not err <= TOL:
                raise SystemExit(f"{title}: {t.name} differs from the floor by {err:.2e} (> {TOL}); not timing")
        times: dict[str, list[float]] = {t.name: [] for t in able}
        mem: dict[str, float] = {}
        for r in range(args.repeats):
            order = able if r % 2 == 0 else list(reversed(able))  # interleaved, alternating order
            for t in order:
                sync(device)
                if r == 0:
                    with PeakMemory(device) as pm:
                        t0 = time.perf_counter()
                        fn(t)
                        sync(device)
                        times[t.name].append(time.perf_counter() - t0)
                    mem[t.name] = pm.added
                else:
                    t0 = time.perf_counter()
                    fn(t)
                    sync(device)
                    times[t.name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        floor = med[able[0].name]
        results.append({"row": title, "key": key, "seconds": med, "ratio": {k: floor / v for k, v in med.items()},
                        "memory_mib": mem})
        line = "  ".join(f"{k} {floor / v:.2f}x ({v:.3f}s, +{mem[k]:.0f} MiB)" for k, v in med.items())
        print(f"{title}: {line}", flush=True)

    # the clean passes the resumed variants need, once per layer and item set: timed after the warm-up, interleaved
    base_batch = AgreementFormatter()(base_ex, adapter, torch.arange(len(base_ex)))
    clean_t: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.repeats):
        for kv in ((False, True) if r % 2 == 0 else (True, False)):
            sync(device)
            t0 = time.perf_counter()
            adapter.clean_states(base_batch, [layer], kv=kv)
            sync(device)
            clean_t[kv].append(time.perf_counter() - t0)
    clean_med = {kv: statistics.median(v) for kv, v in clean_t.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.processor() or platform.machine()} CPU, {args.threads} threads"
    print(f"\n{args.size} {model.config.model_type} shape (random weights), {args.n} sentences / pairs, float32, {where}, "
          f"median of {args.repeats} interleaved rounds, {datetime.date.today()}")
    print(f"versions: {', '.join(f'{k} {v}' for k, v in versions.items())}")
    print(f"cprobe resumed: its clean passes to layer {layer} ({args.n} bases and the DAS batch), made once before "
          f"timing, took {clean_s:.3f}s cold; with the prefix's key/value cache of blocks {layer + 1} … {L} "
          f"(cprobe resumed+KV) {clean_kv_s:.3f}s cold; the {args.n} bases' alone, warm (median of {args.repeats}): "
          f"{clean_med[False]:.3f}s to layer {layer}, {clean_med[True]:.3f}s with the key/value cache")
    if missing:
        print(f"not installed (pip install 'cprobe[peers]'): {'; '.join(missing)}")
    names = [t.name for t in tools]
    print("\n| work | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for res in results:
        cells = [f"{res['ratio'][k]:.2f}x" if k in res["ratio"] else "—" for k in names]
        print(f"| {res['row']} | " + " | ".join(cells) + " |")
    print("| memory added by one run (MiB) | " + " | ".join(
        " / ".join(f"+{r['memory_mib'][k]:.0f}" if k in r["memory_mib"] else "—" for r in results) for k in names)
        + " |")
    for res in results:
        if res["key"] in ("interchange", "das"):
            peers = {k: v for k, v in res["ratio"].items()
                     if k not in ("bare HF", "cprobe", "cprobe resumed", "cprobe resumed+KV")}
            best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
            vs = f"; cprobe / the best peer ({best[0]}) = {res['ratio']['cprobe'] / best[1]:.2f}x" if best else ""
            print(f"{res['row']}: cprobe / floor = {res['ratio']['cprobe']:.2f}x{vs}")
            r = res["ratio"]["cprobe resumed"]
            vs = f"; / the best peer ({best[0]}) = {r / best[1]:.2f}x" if best else ""
            print(f"{res['row']}: cprobe resumed / floor = {r:.2f}x; / cprobe = {r / res['ratio']['cprobe']:.2f}x{vs}")
            k = res["ratio"]["cprobe resumed+KV"]
            print(f"{res['row']}: cprobe resumed+KV / floor = {k:.2f}x; / cprobe resumed = {k / r:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "versions": versions, "args": vars(args) | {
            "json": str(args.json)}, "results": results, "clean_s": {"resumed": clean_med[False],
                                                                       "resumed+KV": clean_med[True]}}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
