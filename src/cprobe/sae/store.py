"""Trained SAEs in the cache (kind ``sae``): one checked entry per content of the training states, every training
setting and the model and hook the SAE records (SAELens's ``metadata``), each a folder in SAELens's format
(:mod:`cprobe.sae.saelens`) plus ``quality.json`` (FVU, L0 and dead fraction on the training states, the training's
seconds). A second fit on the same states reads it back."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch import Tensor

from cprobe.cache import checked_entry, kind_dir
from cprobe.io import fast_digest, write_json
from cprobe.sae import saelens
from cprobe.sae.dictionary import SAE
from cprobe.sae.quality import measure
from cprobe.sae.train import TrainSettings, minibatches, train

log = logging.getLogger(__name__)

VERSION = 2  # bump when training changes what a setting produces, or the folder's format (2: SAELens 6's cfg.json)
QUALITY = "quality.json"


def key(X: Tensor, settings: TrainSettings, model_name: str | None = None, hook_name: str | None = None) -> str:
    """The entry's name: a digest of the states' float32 bytes, their shape, the settings, the recorded names and
    :data:`VERSION`."""
    states = fast_digest(X.detach().to("cpu", torch.float32).contiguous())
    blob = json.dumps({"states": states, "shape": list(X.shape), "settings": settings.as_dict(), "v": VERSION,
                       "model_name": model_name, "hook_name": hook_name}, sort_keys=True)
    return fast_digest(blob.encode())[:32]


def trained(X: Tensor, settings: TrainSettings, cache_root: Path | None, model_name: str | None = None,
            hook_name: str | None = None) -> tuple[SAE, dict[str, float]]:
    """An SAE trained on the states ``X`` (n, d) with ``settings``, recording ``model_name`` and ``hook_name`` (where
    given), and its quality on them; read from the cache under ``cache_root`` when it was trained before
    (``cache_root=None``: trained, not kept)."""

    def fit() -> tuple[SAE, dict[str, float]]:
        t0 = time.perf_counter()
        sae = train(minibatches(X, settings.batch_size, settings.seed), X.shape[1], settings)
        sae.model_name, sae.hook_name = model_name, hook_name
        quality = {**measure(sae, X), "train_seconds": time.perf_counter() - t0}
        log.info("SAE (%s, %d latents) trained on %d states: FVU %.3f, L0 %.1f, dead %.3f", settings.architecture,
                 settings.d_sae, len(X), quality["fvu"], quality["l0"], quality["dead_fraction"])
        return sae, quality

    if cache_root is None:
        return fit()
    made: dict[str, tuple[SAE, dict[str, float]]] = {}

    def build(tmp: Path) -> None:
        made["sae"] = fit()
        saelens.save(made["sae"][0], tmp)
        write_json(tmp / QUALITY, made["sae"][1])

    entry, _ = checked_entry(kind_dir(cache_root, "sae") / key(X, settings, model_name, hook_name), build,
                             f"an SAE on {len(X)} states ({settings.architecture}, {settings.d_sae} latents)")
    if "sae" in made:
        return made["sae"]
    return saelens.load(entry), json.loads((entry / QUALITY).read_text())
