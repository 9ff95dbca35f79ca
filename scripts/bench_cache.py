"""Activation-cache I/O against raw disk I/O of the same bytes, in one process.

Writes ``--tensors`` tensors of (n, d) float32 (the issue's case: pythia-1.4b, every layer, 10,000 sentences = 25 ×
10,000 × 2,048, 2.05 GB) through the cache (sharded, XXH3-checksummed safetensors, atomic renames) and, as the
baseline, the same bytes with plain ``write()`` calls into files of the same sizes; then reads both back (the cache
verifying every checksum into one buffer per tensor; the baseline ``readinto`` the same buffers). Prints GB/s and
the ratios (targets: write ≥ 0.5×, read ≥ 0.8× raw). Reads are warm (the page cache holds the files, as right after
an extraction); ``--fsync`` flushes every written file to the disk on both sides.

    python scripts/bench_cache.py [--n 10000] [--d 2048] [--tensors 25] [--dir /tmp] [--repeats 3] [--fsync]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from cprobe.cache import ActivationCache
from cprobe.io import _bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--tensors", type=int, default=25)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--shard-mb", type=float, default=256)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fsync", action="store_true")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    data = {f"L{i}": torch.randn(args.n, args.d, generator=g).to(dtype) for i in range(args.tensors)}
    total = sum(t.numel() * t.element_size() for t in data.values())
    root = Path(tempfile.mkdtemp(prefix="cprobe-bench-cache-", dir=args.dir))
    if args.fsync:
        os.environ["CPROBE_FSYNC"] = "1"
    try:
        cache = ActivationCache(root / "cache", shard_mb=args.shard_mb)
        row = sum(t[:1].numel() * t.element_size() for t in data.values())
        best = {"cache write": float("inf"), "raw write": float("inf"), "cache read": float("inf"),
                "raw read": float("inf")}
        for r in range(args.repeats):
            entry = cache.entry({"bench": r}, args.n)
            with entry.lock():
                entry.init(max(1, int(args.shard_mb * 2**20) // row))  # the shard ranges both sides write
            raw = root / f"raw{r}"

            def cache_write():
                with entry.lock():
                    for j, (a, b) in enumerate(entry.ranges()):
                        for k, t in data.items():
                            entry.write(k, j, t[a:b])
                    entry.finish()

            def raw_write():
                raw.mkdir()
                for j, (a, b) in enumerate(entry.ranges()):
                    for k, t in data.items():
                        with open(raw / f"{k}.{j}", "wb") as f:
                            f.write(_bytes(t[a:b]))
                            if args.fsync:
                                f.flush()
                                os.fsync(f.fileno())

            def cache_read():
                for k in data:
                    assert entry.read(k) is not None

            def raw_read():
                for k in data:
                    buf = torch.empty(args.n, args.d, dtype=dtype)
                    for j, (a, b) in enumerate(entry.ranges()):
                        with open(raw / f"{k}.{j}", "rb", buffering=0) as f:
                            f.readinto(_bytes(buf[a:b]))

            # alternate which side goes first: the page cache and the disk's write-back favour neither
            steps = [("cache write", cache_write), ("raw write", raw_write), ("cache read", cache_read),
                     ("raw read", raw_read)]
            if r % 2:
                steps = [steps[1], steps[0], steps[3], steps[2]]
            for name, fn in steps:
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
            shard_rows, n_ranges = entry.shard_rows, len(entry.ranges())
            shutil.rmtree(entry.dir)
            shutil.rmtree(raw)
        print(f"{args.tensors} tensors × {args.n} × {args.d} {args.dtype} = {total / 1e9:.2f} GB, shards of "
              f"{shard_rows} rows ({n_ranges} per tensor), fsync={args.fsync}, dir={root}")
        for name, s in best.items():
            print(f"  {name:<12} {s:7.2f} s  {total / s / 1e9:6.2f} GB/s")
        w = best["raw write"] / best["cache write"]
        rd = best["raw read"] / best["cache read"]
        print(f"cache write / raw = {w:.2f} (target ≥ 0.5); cache read / raw = {rd:.2f} (target ≥ 0.8)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
