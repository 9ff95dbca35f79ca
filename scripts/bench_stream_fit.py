"""A streaming LEACE fit over an activation store larger than memory: peak RSS and time.

Writes ``--n`` × ``--d`` states (a class signal along a few directions, ``--classes`` labels) shard by shard into an
activation-cache entry (never all in memory), then fits LEACE from the shards (:func:`cprobe.extract.fit_streaming`:
one shard in memory at a time) and checks the erasure on the first shard (every class mean equal after the edit).
Prints the process's peak RSS against the in-memory size of the states. Target: 1M × 2,048 with ≤ 2 GB.

    python scripts/bench_stream_fit.py [--n 1000000] [--d 2048] [--shard-mb 128] [--dtype float32] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch

from cprobe.cache import ActivationCache
from cprobe.extract import Activations, fit_streaming
from cprobe.interventions.leace import LEACE


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--shard-mb", type=float, default=128)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    root = Path(tempfile.mkdtemp(prefix="cprobe-bench-stream-", dir=args.dir))
    try:
        cache = ActivationCache(root, shard_mb=args.shard_mb)
        entry = cache.entry({"bench": "stream"}, args.n)
        g = torch.Generator().manual_seed(0)
        signal = torch.randn(args.classes, args.d, generator=g)
        z = torch.randint(0, args.classes, (args.n,), generator=g)
        t0 = time.perf_counter()
        with entry.lock():
            entry.init(max(1, int(args.shard_mb * 2**20) // (args.d * dtype.itemsize)))
            for j, (a, b) in enumerate(entry.ranges()):
                x = torch.randn(b - a, args.d, generator=g) + signal[z[a:b]]
                entry.write("X", j, x.to(dtype))
                del x
            entry.finish()
        t_write = time.perf_counter() - t0
        rss_write = peak_rss_gb()
        acts = Activations(args.n, entry=entry)
        t0 = time.perf_counter()
        eraser = fit_streaming(LEACE(), acts, "X", z)
        eraser.P  # solve
        t_fit = time.perf_counter() - t0
        _, b, first = next(acts.shards(["X"]))
        def gap(x: torch.Tensor) -> float:
            means = torch.stack([x[z[:b] == c].mean(0) for c in range(args.classes)])
            return float((means - means.mean(0)).norm(dim=1).max())

        before, after = gap(first["X"].float()), gap(eraser.transform(first["X"].float()))
        size = args.n * args.d * dtype.itemsize / 2**30
        print(f"n={args.n:,} × d={args.d} {args.dtype} = {size:.2f} GiB of states in {len(entry.ranges())} shards of "
              f"{entry.shard_rows:,} rows; torch threads {torch.get_num_threads()}")
        print(f"  write {t_write:.1f} s, streaming LEACE fit {t_fit:.1f} s ({args.n / t_fit:,.0f} rows/s)")
        print(f"  peak RSS {peak_rss_gb():.2f} GiB (after writing: {rss_write:.2f} GiB) — the states alone would "
              f"take {size:.2f} GiB; target ≤ 2 GiB")
        print(f"  erasure check on the first shard: max class-mean gap {before:.2f} before the edit, {after:.2f} after "
              "(sampling noise of one shard)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
