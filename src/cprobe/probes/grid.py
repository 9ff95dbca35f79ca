"""Grid-search training shared by the probes, and fitted probes saved/loaded as checksummed safetensors.

Training is plain mini-batch Adam on cross-entropy with whole tensors kept on the device (no DataLoader, no
per-sample Python); every grid point is scored by validation accuracy, ties going to the lower validation loss.
"""

from __future__ import annotations

import itertools
import json
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import torch
from torch import Tensor, nn

from cprobe.compute import fit_threads
from cprobe.errors import ConfigError, DataError
from cprobe.probes.base import Probe


def check_grid_axis(name: str, values: Sequence[Any], positive: bool = True) -> tuple[Any, ...]:
    """A non-empty tuple of (by default strictly positive) grid values, else ConfigError."""
    values = tuple(values) if isinstance(values, Sequence) and not isinstance(values, str) else (values,)
    if not values:
        raise ConfigError(f"{name} grid is empty; give at least one value")
    if positive and any(not isinstance(v, int | float) or v <= 0 for v in values):
        raise ConfigError(f"{name} values must be positive numbers, got {list(values)}")
    return values


class GridSearchProbe(Probe):
    """Fits one module per grid point and keeps the best by validation accuracy (lower validation loss on ties).

    Subclasses give the grid (``_grid``) and build a module for a grid point (``_build``).
    After ``fit``: ``module``, ``best_params``, ``val_accuracy`` and ``grid_results``
    (each grid point with its validation accuracy).
    """

    def __init__(self, epochs: int, batch_size: int, weight_decay: float, val_fraction: float, seed: int,
                 device: str | None) -> None:
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
        if not 0 < val_fraction < 1:
            raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.epochs, self.batch_size, self.weight_decay = epochs, batch_size, weight_decay
        self.val_fraction, self.seed, self.device = val_fraction, seed, device

    @abstractmethod
    def _grid(self) -> list[dict[str, Any]]:
        """The grid points, each a dict with at least ``lr``."""

    @abstractmethod
    def _build(self, d: int, k: int, params: Mapping[str, Any]) -> nn.Module:
        """A fresh module for d-dimensional inputs and k classes at one grid point."""

    def _n_val(self, n: int) -> int:
        """How many of ``n`` rows are held out for validation (``val_fraction``, at least one, never all)."""
        n_val = max(1, round(self.val_fraction * n))
        if n_val >= n:
            raise DataError(f"{n} rows are too few to hold out a validation split")
        return n_val

    def _pass(self, module: nn.Module, opt: torch.optim.Optimizer, X: Tensor, y: Tensor, gen: torch.Generator) -> None:
        """One pass of mini-batch Adam on cross-entropy over (X, y), in an order drawn from ``gen``."""
        for idx in torch.randperm(len(X), generator=gen).to(X.device).split(self.batch_size):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(module(X[idx]), y[idx]).backward()
            opt.step()

    def _adam(self, module: nn.Module, lr: float) -> torch.optim.Optimizer:
        """Adam in one fused kernel per step (a width-1024 MLP's step on one core: 54 -> 36 ms, the update itself 17
        -> 4 ms, where the per-tensor loop and ``foreach`` take the same time); ``foreach`` on a device without one
        (torch checks only at the first step, so the device is asked here)."""
        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices as fused_devices
            fused = all(p.device.type in fused_devices() for p in module.parameters())
        except ImportError:  # torch moved it: the update every device has
            fused = False
        return torch.optim.Adam(module.parameters(), lr=lr, weight_decay=self.weight_decay, fused=fused or None,
                                foreach=not fused)

    def _train(self, module: nn.Module, X: Tensor, y: Tensor, lr: float, gen: torch.Generator) -> None:
        opt = self._adam(module, lr)
        module.train()
        for _ in range(self.epochs):
            self._pass(module, opt, X, y, gen)
        module.eval()

    def _select(self, scored: Iterable[tuple[dict[str, Any], float, float, nn.Module]]) -> Self:
        """Keep the best of the ``(params, val accuracy, val loss, module)`` grid points; ``grid_results`` lists them.

        Best validation accuracy; ties (common: many points reach 100%) go to the lower validation loss, i.e. the
        better-trained, more confident probe, not to whichever came first."""
        self.grid_results: list[tuple[dict[str, Any], float]] = []
        best: tuple[float, float, dict[str, Any], nn.Module] | None = None
        for params, acc, loss, module in scored:
            self.grid_results.append((params, acc))
            if best is None or (acc, -loss) > (best[0], -best[1]):
                best = (acc, loss, params, module)
        assert best is not None  # the grid is checked non-empty at construction
        self.val_accuracy, _, self.best_params, self.module = best
        return self

    def fit(self, X: Tensor, y: Tensor, X_val: Tensor | None = None, y_val: Tensor | None = None) -> Self:
        if (X_val is None) != (y_val is None):
            raise DataError("pass both X_val and y_val, or neither")
        _check_rows(X, y)
        device = torch.device(self.device) if self.device else X.device
        X, y = X.to(device=device, dtype=torch.float32), y.to(device=device, dtype=torch.long)
        if X_val is None:
            n_val = self._n_val(len(X))
            perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(self.seed)).to(X.device)
            X, y, X_val, y_val = X[perm[n_val:]], y[perm[n_val:]], X[perm[:n_val]], y[perm[:n_val]]
        else:
            X_val = X_val.to(device=device, dtype=torch.float32)
            y_val = y_val.to(device=device, dtype=torch.long)  # type: ignore[union-attr]
        k = int(max(y.max(), y_val.max())) + 1
        d = X.shape[1]
        self.n_classes, self.d = k, d
        op_flops = self._op_flops(d, k)

        def scored() -> Iterator[tuple[dict[str, Any], float, float, nn.Module]]:
            for params in self._grid():
                gen = torch.Generator().manual_seed(self.seed)
                module = self._init(d, k, params).to(device)
                with torch.enable_grad(), fit_threads(op_flops, device):
                    self._train(module, X, y, params["lr"], gen)
                with torch.inference_mode():
                    logits = module(X_val)
                    acc = (logits.argmax(-1) == y_val).double().mean().item()
                    loss = nn.functional.cross_entropy(logits, y_val).item()
                yield params, acc, loss, module

        return self._select(scored())

    def _init(self, d: int, k: int, params: Mapping[str, Any]) -> nn.Module:
        """A grid point's fresh module, initialised from the seed alone."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self._build(d, k, params)

    def _op_flops(self, d: int, k: int) -> float:
        """Flops of the largest matmul of one training step (what decides whether threads pay off)."""
        with torch.device("meta"):  # shapes only: nothing allocated, no random numbers drawn
            biggest = max(max(p.numel() for p in self._build(d, k, params).parameters()) for params in self._grid())
        return 2.0 * self.batch_size * biggest

    def fit_stream(self, shards: Iterable[tuple[Tensor, Tensor]]) -> Self:
        """Fit from a re-iterable stream of consecutive ``(X, y)`` shards (e.g. an activation cache's), one shard in
        memory at a time: every grid point trains in lockstep over one pass per epoch; the validation rows are
        the same seeded share of all rows as :meth:`fit` holds out, and with a single shard the result equals
        :meth:`fit` exactly.
        """
        n, d, k = 0, None, 0
        for X, y in shards:  # a first pass: sizes and classes
            _check_rows(X, y)
            n, d, k = n + len(X), X.shape[1], max(k, int(y.max()) + 1 if len(y) else 0)
        if d is None or n == 0:
            raise DataError("the stream holds no rows")
        n_val = self._n_val(n)
        device = torch.device(self.device) if self.device else torch.device("cpu")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        rank = torch.empty(n, dtype=torch.long)
        rank[perm] = torch.arange(n)  # where each row sits in fit()'s permuted order
        is_val = rank < n_val
        self.n_classes, self.d = k, d
        grid = self._grid()
        modules = [self._init(d, k, p).to(device) for p in grid]
        opts = [self._adam(m, p["lr"]) for m, p in zip(modules, grid)]
        gens = [torch.Generator().manual_seed(self.seed) for _ in grid]

        def parts(val: bool):
            a = 0
            for X, y in shards:
                b = a + len(X)
                sel = (is_val[a:b] if val else ~is_val[a:b]).nonzero().flatten()
                sel = sel[torch.argsort(rank[a:b][sel])]
                a = b
                if len(sel):
                    yield X[sel].to(device, torch.float32), y[sel].to(device, torch.long)

        with torch.enable_grad(), fit_threads(self._op_flops(d, k), device):
            for m in modules:
                m.train()
            for _ in range(self.epochs):
                for X, y in parts(val=False):
                    for m, opt, gen in zip(modules, opts, gens):
                        self._pass(m, opt, X, y, gen)
            for m in modules:
                m.eval()
        correct, loss_sum = [0] * len(grid), [0.0] * len(grid)
        with torch.inference_mode():
            for X, y in parts(val=True):
                for g, m in enumerate(modules):
                    logits = m(X)
                    correct[g] += int((logits.argmax(-1) == y).sum())
                    loss_sum[g] += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        return self._select((p, correct[g] / n_val, loss_sum[g] / n_val, modules[g]) for g, p in enumerate(grid))


def _check_rows(X: Tensor, y: Tensor) -> None:
    if X.ndim != 2 or y.shape != (len(X),):
        raise DataError(f"X must be (n, d) and y (n,), got {tuple(X.shape)} and {tuple(y.shape)}")


def save_probe(probe: GridSearchProbe, path: Path, extra: Mapping[str, str] | None = None) -> None:
    """A fitted probe as checksummed safetensors: weights + its grid point and sizes as metadata (no pickle)."""
    from cprobe.io import atomic_save_tensors

    meta = {**(extra or {}), "best_params": json.dumps(probe.best_params), "n_classes": str(probe.n_classes),
            "d": str(probe.d), "val_accuracy": repr(probe.val_accuracy)}
    atomic_save_tensors(path, probe.module.state_dict(), meta)


def load_probe(probe: GridSearchProbe, path: Path) -> GridSearchProbe | None:
    """Fill an unfitted ``probe`` (built from the same config) with the weights saved at ``path``; None when
    the file is missing, unreadable or fails its checksum (the caller refits)."""
    from cprobe.io import load_tensors, read_metadata

    state = load_tensors(path)
    if state is None:
        return None
    meta = read_metadata(path)
    params, k, d = json.loads(meta["best_params"]), int(meta["n_classes"]), int(meta["d"])
    module = probe._build(d, k, params)
    module.load_state_dict(state)
    device = torch.device(probe.device) if probe.device else torch.device("cpu")
    probe.module, probe.best_params, probe.n_classes, probe.d = module.to(device).eval(), params, k, d
    probe.val_accuracy = float(meta["val_accuracy"])
    probe.fitted_ = True
    return probe


PROBE_FITS = "probe_fits"
"""The cache kind (``<cache root>/probe_fits/``) of :func:`fit_cached`."""
_FIT_CACHE_VERSION = 3  # bump when training changes what a fit returns for the same inputs; 2: the one probe-fit kind;
# 3: Adam's fused update (equal to the per-tensor loop's to ~1e-7, not bit for bit)
# (the reliability study's fits moved here from the retired `probes` kind)


def probe_settings(probe: GridSearchProbe) -> dict[str, Any]:
    """The probe's constructor arguments as plain values (its grid, training settings, seed and device)."""
    import inspect

    out: dict[str, Any] = {"class": f"{type(probe).__module__}.{type(probe).__qualname__}"}
    for name in inspect.signature(type(probe).__init__).parameters:
        if name != "self" and hasattr(probe, name):
            v = getattr(probe, name)
            out[name] = list(v) if isinstance(v, tuple) else v
    return out


def _tensor_digest(h: Any, t: Tensor | None) -> None:
    if t is None:
        h.update(b"none")
        return
    t = t.detach().to("cpu").contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def fit_key(probe: GridSearchProbe, X: Tensor, y: Tensor, X_val: Tensor | None = None,
            y_val: Tensor | None = None) -> str:
    """What determines a fit: the training (and validation) activations and labels by content, every probe
    setting (the grid, epochs, batch size, seed, ...) and the kind of device it trains on."""
    import hashlib

    dev = getattr(probe, "device", None)
    device = torch.device(dev) if dev else X.device
    settings = {k: v for k, v in probe_settings(probe).items() if k != "device"}
    h = hashlib.sha256(json.dumps({"probe": settings, "device_type": device.type,
                                   "v": _FIT_CACHE_VERSION}, sort_keys=True, default=str).encode())
    for t in (X, y, X_val, y_val):
        _tensor_digest(h, t)
    return h.hexdigest()[:24]


def fit_cached(probe: Probe, X: Tensor, y: Tensor, X_val: Tensor | None = None, y_val: Tensor | None = None,
               cache_dir: Path | None = None) -> tuple[Probe, str]:
    """``probe.fit(X, y, X_val, y_val)``, or the same fit read back from ``cache_dir`` (checksummed
    safetensors, keyed by :func:`fit_key`; a file lock makes parallel jobs fit an entry once).

    Returns (the fitted probe, "fit" or "cache"). Probes without grid-search state, or ``cache_dir=None``,
    are simply fitted. A cached fit holds the same weights, so it scores exactly as the fresh one.
    """
    if cache_dir is None or not isinstance(probe, GridSearchProbe):
        return probe.fit(X, y, X_val, y_val), "fit"
    from cprobe.cache import build_lock

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{fit_key(probe, X, y, X_val, y_val)}.safetensors"
    if path.is_file() and load_probe(probe, path) is not None:
        return probe, "cache"
    with build_lock(str(path) + ".lock", f"a {type(probe).__name__} fit on {len(X)} rows ({path.name})"):
        if path.is_file() and load_probe(probe, path) is not None:
            return probe, "cache"
        probe.fit(X, y, X_val, y_val)
        save_probe(probe, path, {"probe": json.dumps(probe_settings(probe), default=str), "n_train": str(len(X))})
    return probe, "fit"


FitTask = tuple[Probe, Tensor, Tensor, Tensor | None, Tensor | None]
"""One fit of :func:`fit_cached_many`: (the unfitted probe, X, y, X_val, y_val)."""
PARALLEL_MIN_STEPS = 5_000
"""Fits worth a worker process each: below this many optimiser steps in all, the workers' start-up (importing torch,
~2 s) costs more than the second core saves."""


def fit_steps(probe: Probe, n: int) -> int:
    """Optimiser steps of a grid-search fit on ``n`` rows (0 for other probes): what one fit costs on a CPU, where a
    small probe's step is mostly per-step overhead."""
    if not isinstance(probe, GridSearchProbe):
        return 0
    return len(probe._grid()) * probe.epochs * -(-n // probe.batch_size)


def _fit_in_worker(task: FitTask, cache_dir: Path | None) -> tuple[Probe, str, float]:
    """One :func:`fit_cached`, timed: (the fitted probe, "fit" or "cache", seconds)."""
    import time

    t0 = time.perf_counter()
    probe, source = fit_cached(*task, cache_dir=cache_dir)
    return probe, source, time.perf_counter() - t0


def fit_cached_many(tasks: list[FitTask], cache_dir: Path | None = None,
                    processes: int = 1) -> Iterator[tuple[Probe, str, float]]:
    """:func:`fit_cached` over ``tasks``, yielding (the fitted probe, "fit" or "cache", seconds) in their order —
    on up to ``processes`` worker processes when the fits are many and CPU-bound enough to pay for them
    (:data:`PARALLEL_MIN_STEPS`). Every fit runs exactly as it would here (its seed, its thread count), so the probes
    are bitwise the same either way."""
    steps = sum(fit_steps(t[0], len(t[1])) for t in tasks)
    on_cpu = all(t[1].device.type == "cpu" and getattr(t[0], "device", None) in (None, "cpu") for t in tasks)
    n = min(processes, len(tasks))
    if n < 2 or steps < PARALLEL_MIN_STEPS or not on_cpu:
        for task in tasks:
            yield _fit_in_worker(task, cache_dir)
        return
    import multiprocessing
    from functools import partial

    # a Pool, not a ProcessPoolExecutor: left early (Ctrl-C, SIGTERM, an error, a consumer that stops), it terminates
    # its workers at once, where the executor's exit waits for every queued fit (a minute of training after Ctrl-C)
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        yield from pool.imap(partial(_fit_in_worker, cache_dir=cache_dir), tasks)


def product_grid(**axes: tuple[Any, ...]) -> list[dict[str, Any]]:
    """All combinations of the axes as dicts, in row-major order."""
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes.values())]

