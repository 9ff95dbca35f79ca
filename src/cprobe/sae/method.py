"""What the SAE methods share: where their SAE comes from and which of its latents carry the property.

The settings (of every SAE method: ``sae_decoder``, ``sae_latents``, ``sae_axbench``, ``sae_diffmean``; docs/sae.md):

- ``path``: a local folder in SAELens's format to load (:mod:`cprobe.sae.saelens`); refused in one line when it
  records another model than ``model`` or another hook point than ``layer`` (each when set; checked when the method is
  built, at validation), and when its width is not the states' (when it is fitted). Without ``path`` an SAE is trained on the fitting states themselves (the activations at the site, from
  the activation cache) with ``architecture`` (``topk`` / ``relu``), ``d_sae``, ``k`` (TopK), ``l1`` (ReLU),
  ``lr`` (null: sparsify's rule), ``epochs``, ``batch_size`` and the method's seed, and kept in the cache (kind
  ``sae``, keyed by the states' content and every setting) unless ``cache: false``.
- ``select``: the rule that scores latents (:data:`cprobe.sae.select.RULES`; AxBench's SAE: ``TEXT_RULES``);
  ``latents``: how many are used.

After fitting, ``sae_`` is the SAE, ``quality_`` its FVU, L0 and dead fraction on the fitting states (logged),
``latents_`` the selected latent indices (best first) and ``scores_`` every latent's score.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.paths import cache_dir
from cprobe.sae import saelens, store
from cprobe.sae import select as selection
from cprobe.sae.dictionary import SAE
from cprobe.sae.quality import measure
from cprobe.sae.train import TrainSettings


class SAEMethod:
    """The shared settings and fitting steps of the SAE methods (module doc). ``RULES``: the ``select`` values a
    method takes (AxBench's SAE takes :data:`cprobe.sae.select.TEXT_RULES`)."""

    RULES: tuple[str, ...] = selection.RULES

    def __init__(self, path: str | None = None, architecture: str = "topk", d_sae: int = 512, k: int = 16,
                 l1: float = 1.0, lr: float | None = None, epochs: int = 20, batch_size: int = 256,
                 select: str = "mean_diff", latents: int = 1, model: str | None = None, layer: int | None = None,
                 cache: bool = True, seed: int = 0) -> None:
        if select not in self.RULES:
            raise ConfigError(f"unknown SAE select {select!r}; choose from {list(self.RULES)}")
        if not (isinstance(latents, int) and latents >= 1):
            raise ConfigError(f"SAE latents must be an integer >= 1, got {latents!r}")
        self.path, self.model, self.layer, self.cache = path, model, layer, bool(cache)
        if path is not None:  # the folder, its format and what it records, checked before any model loads
            saelens.check_recorded(saelens.read_cfg(path), f"folder {path}", model=model, layer=layer)
        self.select, self.latents = select, latents
        self.train_settings = TrainSettings(architecture=architecture, d_sae=d_sae, k=k, l1=float(l1),
                                            lr=None if lr is None else float(lr), epochs=epochs,
                                            batch_size=batch_size, seed=seed)

    def check_states(self, d: int) -> None:
        """One line, before any state is read, when the loaded SAE (``path``) cannot read states of width ``d``: its
        ``cfg.json``'s ``d_in`` (the weights are checked again when fitted). A trained SAE fits any width."""
        if self.path is None:
            return
        d_in = saelens.read_cfg(self.path).get("d_in")
        if d_in is not None and int(d_in) != d:
            raise ConfigError(f"SAE folder {self.path} reads states of width {d_in}, but the states here have width "
                              f"{d}: an SAE of another width, for another model or layer")

    def fit_latents(self, X: Tensor, z: Tensor) -> Tensor:
        """Obtain the SAE for the states ``X`` (n, d), select the property's latents from the class ids ``z``;
        returns the latents of ``X`` (n, d_sae) on the CPU in float32."""
        Xc = X.detach().to("cpu", torch.float32)
        self.sae_ = self._sae(Xc)
        F = self.sae_.encode(Xc)
        if self.latents > self.sae_.d_sae:
            raise ConfigError(f"SAE latents={self.latents} but the SAE has only {self.sae_.d_sae}")
        self.scores_ = selection.scores(self.select, self.sae_, Xc, F, z.cpu().long())
        self.latents_ = selection.top(self.scores_, self.latents)
        return F

    def _sae(self, X: Tensor) -> SAE:
        if self.path is None:
            sae, self.quality_ = store.trained(X, self.train_settings, cache_dir() if self.cache else None)
            return sae
        sae = saelens.load(self.path)
        saelens.check_width(sae, X.shape[1], f"folder {self.path}")
        self.quality_ = measure(sae, X)
        return sae

