"""The demo, cold vs warm: `cprobe run +experiment=sva_tiny` on an empty cache, then again on the filled one.

Prints both wall times and their ratio (target: warm ≤ 10 % of cold). A warm run reads the tiny model, the hidden
states and every probe fit back from the cache. ``--keep-model DIR`` seeds the empty cache with the trained tiny
models of another cache (so "cold" then means: extraction and probe fits, no model training); extra arguments are
passed to `cprobe run` (e.g. ``--smoke`` for a quick check).

    python scripts/bench_demo.py [--keep-model ~/.cache/cprobe] [-- --smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(cache: Path, out: Path, extra: list[str]) -> float:
    exe = Path(sys.executable).with_name("cprobe")
    env = {**os.environ, "CPROBE_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    r = subprocess.run([str(exe), "run", "+experiment=sva_tiny", f"paths.output_root={out}", *extra], env=env,
                       capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"cprobe failed:\n{r.stderr[-3000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep-model", type=Path, help="copy <DIR>/models into the empty cache first")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    with tempfile.TemporaryDirectory(prefix="cprobe-bench-demo-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        if args.keep_model:
            shutil.copytree(args.keep_model / "models", cache / "models", ignore=shutil.ignore_patterns("*.lock"))
        cold = run(cache, out, extra)
        warm = run(cache, out, extra)
    what = "extraction + probe fits" if args.keep_model else "model training + extraction + probe fits"
    print(f"cold ({what}): {cold:.1f} s")
    print(f"warm (everything cached): {warm:.1f} s")
    print(f"warm / cold: {warm / cold:.3f} (target <= 0.10)")


if __name__ == "__main__":
    main()
