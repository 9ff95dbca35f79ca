"""Small fits on a busy machine: one grid point of the demo's MLP probe (2 × 256, 8 epochs, 1,800 × 128) with the
threads cprobe chooses (:func:`cprobe.compute.fit_threads`: one thread for fits this small) against every usable
CPU, optionally with ``--busy K`` spinning processes keeping the cores busy (started and stopped by this script).
Target: on a busy 2-core machine, within 2× of the idle time.

    python scripts/bench_threads.py [--busy 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import torch

from cprobe.compute import available_cpus, fit_thread_count, threads
from cprobe.probes.mlp import MLPProbe


def _spin() -> None:  # a busy loop in another process (the machine's other work)
    while True:
        pass


def fit_seconds(n_threads: int, X, y, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        probe = MLPProbe(n_layers=(2,), widths=(256,), lrs=(1e-3,), epochs=8)
        t0 = time.perf_counter()
        with threads(n_threads):
            probe._train(probe._init(128, 2, probe._grid()[0]), X, y, 1e-3, torch.Generator().manual_seed(0))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=0, help="spinning processes to start while measuring")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(1800, 128, generator=g), torch.randint(0, 2, (1800,), generator=g)
    cpus = available_cpus()
    chosen = fit_thread_count(MLPProbe(n_layers=(2,), widths=(256,), lrs=(1e-3,))._op_flops(128, 2), cpus)
    idle = {n: fit_seconds(n, X, y, args.repeats) for n in sorted({chosen, cpus})}
    procs = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for pr in procs:
        pr.start()
    try:
        busy = {n: fit_seconds(n, X, y, args.repeats) for n in sorted({chosen, cpus})} if procs else {}
    finally:
        for pr in procs:
            pr.terminate()
            pr.join()
    print(f"usable CPUs {cpus}; cprobe chooses {chosen} thread(s) for this fit; busy processes: {args.busy}")
    for n in sorted(idle):
        line = f"  {n} thread(s): idle {idle[n]:6.2f} s"
        if busy:
            line += f", busy {busy[n]:7.2f} s ({busy[n] / idle[n]:5.1f}× idle)"
        print(line)
    if busy:
        print(f"chosen on a busy machine / chosen idle = {busy[chosen] / idle[chosen]:.2f} (target ≤ 2); "
              f"{cpus} threads busy / chosen idle = {busy[cpus] / idle[chosen]:.1f}")


if __name__ == "__main__":
    main()
