"""DAS training throughput: every CausalGym site's direction trained one site at a time (the runner before the
batched pass) vs many sites in one batched forward per step (``DAS.fit_many`` + ``models.multisite.SitesForward``).

Same model, same train pairs, same sites, same seed and budget; prints optimiser steps per second of each, their ratio
and the largest difference between the directions they learn (the batched pass must learn the same ones; tolerance
1e-4). Default model: a random-init GPT-NeoX of the tiny CausalGym model's shape (no download); ``--shape pythia-70m``
for a Pythia-70m-shaped one, ``--device cuda`` on a GPU.

k-dimensional DAS (issue 52): the batched pass at k = 1 against the same pass of the code before ``k`` existed
(``--before``, a git revision: its ``directions/das.py`` and ``models/multisite.py`` loaded beside today's, in this
process, alternated ``--repeats`` times, best of each): the time ratio (target ≈ 1.0) and max |Δa| (the 1-D path is
unchanged: 0). Then each ``--k`` > 1, its time over k = 1's. On the CPU the times are this process's CPU time
(``--wall`` for wall-clock), so a busy shared machine does not skew the ratios; on a GPU, wall-clock.

    python scripts/bench_das.py [--shape tiny|pythia-14m|pythia-70m] [--pairs 40] [--device cpu|cuda]
    python scripts/bench_das.py --skip-one --layers 2 --k 2 8   # only the k checks
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from cprobe.data.causalgym import CONTROL_LABELS, TaskTemplate, control_pairs, label_token_ids, make_pair_splits
from cprobe.data.causalgym import pair_items
from cprobe.directions.das import DAS
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Edit
from cprobe.models.formatters import RegionFormatter
from cprobe.models.readouts import Vocabulary
from cprobe.models.sites import Site
from cprobe.models.tiny import build_tokenizer
from cprobe.models.multisite import SitesForward

NOUNS = [f"n{i}" for i in range(30)]
SPEC = {  # the agreement templates' shape: 6 regions from the label on
    "templates": ["the {subject} that the {object} {verbed} near the {place} {adv}"],
    "label": "subject", "result_prepend_space": True,
    "labels": {"singular": ["is", "was"], "plural": ["are", "were"]},
    "variables": {"subject": {"singular": ["author", "guard"], "plural": ["authors", "guards"]}, "object": NOUNS,
                  "verbed": ["liked", "saw", "met"], "place": NOUNS, "adv": ["today", "here"]},
}
SHAPES = {"tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512),
          "pythia-14m": dict(hidden_size=128, num_hidden_layers=6, num_attention_heads=4, intermediate_size=512),
          "pythia-70m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048)}


def main() -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--pairs", type=int, default=40, help="train pairs (doubled by swapping; the paper: 200)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=0, help="read the first N block outputs (0: every block)")
    p.add_argument("--skip-one", action="store_true", help="skip the one-site-at-a-time runner (slow)")
    p.add_argument("--before", default="4832a1e", help="the revision before k-dimensional DAS ('' to skip)")
    p.add_argument("--repeats", type=int, default=3, help="alternated timings of k = 1, now and before (best of)")
    p.add_argument("--k", type=int, nargs="*", default=[2, 8], help="subspace dimensions timed against k = 1")
    p.add_argument("--wall", action="store_true", help="wall-clock time on the CPU (default: this process's CPU time, "
                   "steady on a shared machine)")
    args = p.parse_args()

    template = TaskTemplate.from_spec("bench_agr", SPEC)
    words = ["the", "that", "near", "is", "was", "are", "were", "author", "authors", "guard", "guards", "liked", "saw",
             "met", "today", "here", *NOUNS, *(w.strip() for w in CONTROL_LABELS)]
    tok = build_tokenizer("neox", words, 64)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(tok), max_position_embeddings=64,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                             **SHAPES[args.shape])).to(args.device)
    ad = ModelAdapter(model, tok, "causal", args.shape, batch_size=512)
    splits = make_pair_splits(template, args.pairs, 4)
    base, src = pair_items(splits.train)
    fmt = RegionFormatter()
    batch = fmt(base, ad, torch.arange(len(base)))
    n_layers = args.layers or ad.n_layers
    sites = [Site(l, f"region:{r}", "block") for l in range(1, n_layers + 1)
             for r in range(template.first_label_region, len(template.spans))]
    acts = ad.map(src, fmt, read=sites).acts
    ids, _ = label_token_ids(tok, [lab for ps in (splits.train, control_pairs(splits.train)) for q in ps
                                   for lab in (q.base_label, q.source_label)])
    targets = [torch.tensor([ids[q.source_label] for q in ps]) for ps in (splits.train, control_pairs(splits.train))]
    jobs = [(s, t) for s in sites for t in targets]  # every site × condition, as the runner trains them
    rows = torch.arange(len(base))
    das = DAS(seed=0)
    steps = das.steps(len(rows)) * len(jobs)
    print(f"{args.shape} on {args.device}: {len(sites)} sites × 2 conditions = {len(jobs)} directions, "
          f"{das.steps(len(rows))} steps each (batch {das.batch_size}), d = {ad.hidden_size}")

    def sync() -> None:
        if str(args.device).startswith("cuda"):
            torch.cuda.synchronize()

    def one_at_a_time() -> torch.Tensor:
        """The runner before: per site, per step, the step's rows cut from the batch and one forward of them."""
        out = []
        for site, target in jobs:
            def forward(edit: Edit, idx: torch.Tensor, site=site) -> torch.Tensor:
                return ad.run(batch.select(rows[idx]), edits={site: edit}, readout=Vocabulary(), grad=True).scores
            out.append(DAS(seed=0).fit(forward, acts[site].to(args.device), target.to(args.device)).a)
        return torch.stack(out)

    def batched() -> torch.Tensor:
        das = DAS(seed=0)
        forward = SitesForward(ad, batch, rows, [s for s, _ in jobs], das.windows(len(rows)))
        H = torch.stack([acts[s] for s, _ in jobs]).to(args.device)
        return das.fit_many(forward, H, torch.stack([t for _, t in jobs]))

    clock = time.perf_counter if str(args.device).startswith("cuda") or args.wall else time.process_time

    def timed(fn) -> tuple[float, torch.Tensor]:
        sync()
        t0 = clock()
        a = fn()
        sync()
        return clock() - t0, a.detach().float().cpu()

    if not args.skip_one:
        t_one, a_one = timed(one_at_a_time)
        t_all, a_all = timed(batched)
        for name, t in (("one site at a time", t_one), ("all sites per pass", t_all)):
            print(f"  {name:<20} {t:8.2f} s  {steps / t:9.1f} site-steps/s")
        print(f"batched / one-at-a-time speed = {t_one / t_all:.1f}x; max |Δa| = {(a_one - a_all).abs().max():.2e} "
              f"(tolerance 1e-4)")

    def batched_k(k: int, das_mod=None, multisite=None) -> torch.Tensor:
        das = DAS(seed=0, k=k) if das_mod is None else das_mod.DAS(seed=0)
        forward = (SitesForward if multisite is None else multisite.SitesForward)(
            ad, batch, rows, [s for s, _ in jobs], das.windows(len(rows)))
        H = torch.stack([acts[s] for s, _ in jobs]).to(args.device)
        return das.fit_many(forward, H, torch.stack([t for _, t in jobs]))

    t_k1, _ = timed(lambda: batched_k(1))  # a warm-up (and k = 1's time where --before is empty)
    if args.before:
        das_mod, multisite = before(args.before)
        now, old = [], []
        for _ in range(args.repeats):
            now.append(timed(lambda: batched_k(1)))
            old.append(timed(lambda: batched_k(1, das_mod, multisite)))
        (t_now, a_now), (t_old, a_old) = min(now, key=lambda r: r[0]), min(old, key=lambda r: r[0])
        t_k1 = t_now
        print(f"k = 1: now {t_now:.2f} s, before ({args.before}) {t_old:.2f} s: now / before = {t_now / t_old:.3f} "
              f"(best of {args.repeats}); max |Δa| = {(a_now - a_old).abs().max():.2e}")
    for k in args.k:
        t, _ = timed(lambda: batched_k(k))
        print(f"k = {k}: {t:.2f} s, {t / t_k1:.2f}x the time of k = 1")


def before(rev: str) -> tuple[types.ModuleType, types.ModuleType]:
    """``directions/das.py`` and ``models/multisite.py`` as they were at git revision ``rev``, as fresh modules (the
    old DAS not registered again)."""
    root = Path(__file__).resolve().parents[1]
    out = []
    for name, path in (("das_before", "src/cprobe/directions/das.py"),
                       ("multisite_before", "src/cprobe/models/multisite.py")):
        text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True,
                              check=True).stdout.replace('@DIRECTIONS.register("das")\n', "")
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        exec(compile(text, f"{rev}:{path}", "exec"), mod.__dict__)
        out.append(mod)
    return out[0], out[1]


if __name__ == "__main__":
    main()
