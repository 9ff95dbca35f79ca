"""R-LACE over a grid of ranks, each game warm-started from the one below and kept in the cache.

A rank sweep (``+sweep=reliability_rlace``: ranks 0–40, one Hydra job per rank) plays one game per rank. With
``warm_start``, the game of rank r starts where the game of rank r − 1 ended (:class:`Game`: its relaxed P, projected
onto the rank-r Fantope, and its predictor) instead of the reference's random start. Each finished game is kept in the
cache (kind ``rlace``, one entry ``<key>-rank<r>`` per game), so the job of rank r reads rank r − 1's game from the job
before it and plays one game.

Rank r's result never depends on which jobs ran before it, in which order, or side by side: it is always the last
game of the chain 1 → 2 → … → r (:func:`chained`). A missing link is played (lowest first) and kept, each under its
entry's lock, so parallel jobs wait for a link another job is playing rather than play it twice; a job of rank r alone
plays the whole chain below it. The key of a chain: the states' and labels' content and every setting of the game but
the rank (:data:`VERSION` changes when the game does). ``cache: false`` (or no cache) plays the chain in the process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cprobe.cache import checked_entry, entry_problem, kind_dir
from cprobe.io import atomic_save_tensors, fast_digest, load_tensors

log = logging.getLogger(__name__)

KIND = "rlace"
VERSION = 1  # bump when the game (its steps, stopping or rounding) changes what a setting produces
TENSORS, INFO = "game.safetensors", "game.json"


@dataclass(frozen=True)
class Game:
    """Where a game of rank ``rank`` ended: the relaxed P (d × d, float64, on the rank-``rank`` Fantope), the
    predictor (W, b) and the kept rounding U (d × rank, orthonormal: the directions it removes). A game of a higher rank
    continues from it."""

    P: Tensor
    W: Tensor
    b: Tensor
    U: Tensor
    rank: int


@dataclass(frozen=True)
class Played:
    """One finished game: where it ended (with its kept rounding), the fresh probe's loss and best accuracy, the
    steps, why it stopped, and the rank of the game it started from (None: the random start)."""

    game: Game
    probe_loss: float
    probe_accuracy: float
    steps_run: int
    stop_reason: str
    start_rank: int | None


def key(X: Tensor, z: Tensor, settings: Mapping[str, Any]) -> str:
    """A chain's name: the digest of the states' float64 bytes and shape, the labels, the settings and VERSION."""
    states = fast_digest(X.detach().to("cpu", torch.float64).contiguous())
    labels = fast_digest(z.detach().to("cpu", torch.int64).contiguous())
    blob = json.dumps({"states": states, "shape": list(X.shape), "labels": labels, "settings": dict(settings),
                       "v": VERSION}, sort_keys=True, default=str)
    return fast_digest(blob.encode())[:32]


def chained(X: Tensor, z: Tensor, rank: int, settings: Mapping[str, Any],
            play: Callable[[int, Game | None], Played], cache_root: Path | None) -> Played:
    """The game of rank ``rank`` ≥ 1 at the end of the chain 1 → … → ``rank`` (module doc): ``play(r, start)`` plays
    rank r from ``start`` (None for rank 1). Links already in the cache under ``cache_root`` are read, the others
    played and kept; ``cache_root=None`` plays every link here."""
    if cache_root is None:
        played = None
        for r in range(1, rank + 1):
            played = play(r, None if played is None else played.game)
        assert played is not None
        return played
    base, name = kind_dir(cache_root, KIND), key(X, z, settings)

    def entry(r: int) -> Path:
        return base / f"{name}-rank{r}"

    below = max((r for r in range(1, rank) if entry_problem(entry(r)) is None), default=0)
    played = _read(entry(below)) if below else None
    for r in range(below + 1, rank + 1):
        start = None if played is None else played.game
        made: dict[str, Played] = {}

        def build(tmp: Path, r: int = r, start: Game | None = start) -> None:
            made["game"] = play(r, start)
            _write(tmp, made["game"])

        path, _ = checked_entry(entry(r), build, f"the R-LACE game of rank {r}")
        played = made.get("game") or _read(path)
        if r < rank:
            log.info("R-LACE rank %d: the game of rank %d (%s after %d steps) is in the chain below it", rank, r,
                     played.stop_reason, played.steps_run)
    assert played is not None
    return played


def _write(folder: Path, p: Played) -> None:
    atomic_save_tensors(folder / TENSORS, {"P": p.game.P, "W": p.game.W, "b": p.game.b, "U": p.game.U})
    info = {"rank": p.game.rank, "probe_loss": p.probe_loss, "probe_accuracy": p.probe_accuracy,
            "steps_run": p.steps_run, "stop_reason": p.stop_reason, "start_rank": p.start_rank}
    (folder / INFO).write_text(json.dumps(info, indent=1))


def _read(folder: Path) -> Played:
    t = load_tensors(folder / TENSORS)
    if t is None:
        raise OSError(f"{folder / TENSORS} is unreadable")
    info = json.loads((folder / INFO).read_text())
    return Played(Game(t["P"], t["W"], t["b"], t["U"], int(info["rank"])), float(info["probe_loss"]),
                  float(info["probe_accuracy"]), int(info["steps_run"]), str(info["stop_reason"]), info["start_rank"])
