"""What the SAE methods share: where their SAE comes from, which of its latents carry the property, and the site it
is read at.

The settings (the ``sae`` direction's and the ``sae_latents`` intervention's, docs/sae.md):

- ``path``: a local folder in SAELens's format to load (:mod:`cprobe.sae.saelens`), or a pattern with ``{layer}``
  (``DIR/layer_{layer}``: one folder per layer, the site's layer filled in). Refused in one line when it records
  another model than ``model`` or another hook point than ``layer`` (each when set; checked when the method is
  built), and when its width is not the states' (when it is fitted). Without ``path`` an SAE is trained on the
  fitting states themselves (the activations at the site, from the activation cache) with ``architecture`` (``topk`` /
  ``relu``), ``d_sae``, ``k`` (TopK), ``l1`` (ReLU), ``lr`` (null: sparsify's rule), ``epochs``, ``batch_size`` and
  the method's seed, and kept in the cache (kind ``sae``, keyed by the states' content, every setting and the
  recorded model and hook) unless ``cache: false``; its ``cfg.json`` records ``model`` and ``layer``'s hook.
- ``model``, ``layer``: the model and cprobe layer of the site. A study sets both at every site it fits the method
  at (:func:`at_site`; before any model loads, :func:`check_sites` checks the folders of the layers it can name).
- ``select``: the rule that scores latents (:data:`cprobe.sae.select.RULES`); ``latents``: how many are used.

After fitting, ``sae_`` is the SAE, ``quality_`` its FVU, L0 and dead fraction on the fitting states (logged),
``latents_`` the selected latent indices (best first) and ``scores_`` every latent's score.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    """The shared settings and fitting steps of the SAE methods (module doc)."""

    def __init__(self, path: str | None = None, architecture: str = "topk", d_sae: int = 512, k: int = 16,
                 l1: float = 1.0, lr: float | None = None, epochs: int = 20, batch_size: int = 256,
                 select: str = "mean_diff", latents: int = 1, model: str | None = None, layer: int | None = None,
                 cache: bool = True, seed: int = 0) -> None:
        if select not in selection.RULES:
            raise ConfigError(f"SAE select must be one of {list(selection.RULES)}, got {select!r}")
        if not (isinstance(latents, int) and latents >= 1):
            raise ConfigError(f"SAE latents must be an integer >= 1, got {latents!r}")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 0):
            raise ConfigError(f"SAE layer must be a layer number >= 0 or null, got {layer!r}")
        self.model, self.layer, self.cache = model, layer, bool(cache)
        self.path = None if path is None else saelens.at_layer(path, layer) if layer is not None else str(path)
        if self.path is not None and saelens.LAYER_FIELD not in self.path:  # checked before any model loads
            saelens.check_recorded(saelens.read_cfg(self.path), f"folder {self.path}", model=model, layer=layer)
        self.select, self.latents = select, latents
        self.train_settings = TrainSettings(architecture=architecture, d_sae=d_sae, k=k, l1=float(l1),
                                            lr=None if lr is None else float(lr), epochs=epochs,
                                            batch_size=batch_size, seed=seed)

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
            hook = None if self.layer is None else saelens.layer_hook(self.layer)
            sae, self.quality_ = store.trained(X, self.train_settings, cache_dir() if self.cache else None,
                                               model_name=self.model, hook_name=hook)
            return sae
        if saelens.LAYER_FIELD in self.path:
            raise ConfigError(f"SAE path {self.path} names one folder per layer, but no layer is set here: set the "
                              "method's `layer`")
        sae = saelens.load(self.path)
        saelens.check_width(sae, X.shape[1], f"folder {self.path}")
        self.quality_ = measure(sae, X)
        return sae



def loads_sae(method: Any) -> bool:
    """Whether the method class ``method`` takes the SAE settings: an :class:`SAEMethod`, or a class that forwards its
    settings to one (``forwards_kwargs_to``: the ``sae_direction`` bridge)."""
    targets = (method, *getattr(method, "forwards_kwargs_to", ())) if isinstance(method, type) else ()
    return any(isinstance(t, type) and issubclass(t, SAEMethod) for t in targets)


def at_site(method: Any, params: Mapping[str, Any], layer: int, model: str | None = None) -> dict[str, Any]:
    """The settings ``params`` of the method class ``method`` at the site at cprobe layer ``layer`` of the model
    ``model``: what a study builds the method with at each layer it reads. An SAE method's get ``layer`` (a ``layer``
    setting of another layer is refused: the SAE would run where it was not trained) and ``model`` where unset, so
    building it fills ``{layer}`` into ``path`` and checks the folder's recorded model and hook against this site, and a
    trained SAE records them. Any other method's settings come back as they are."""
    out = dict(params)
    if not loads_sae(method):
        return out
    if out.get("layer") is not None and out["layer"] != layer:
        raise ConfigError(f"SAE setting layer={out['layer']} but the study reads this SAE at layer {layer}: drop "
                          f"`layer` (each site sets its own) or give one folder per layer (path=DIR/layer_"
                          f"{saelens.LAYER_FIELD})")
    out["layer"] = layer
    if out.get("model") is None and model:
        out["model"] = model
    return out


def check_sites(method: Any, params: Mapping[str, Any], layers: Any, model: str | None = None) -> None:
    """Before any model loads: the SAE folder(s) of an SAE method's settings ``params`` checked against the model
    ``model`` and each layer of the study's ``layers`` that is a number >= 0. Symbolic layers (``last``, ``all``,
    negative numbers) need the model's depth: for them the folder — with a pattern ``path``, every existing folder it
    matches — is checked against the model here, and :func:`at_site` checks each layer when the study reaches it.
    One line (ConfigError)."""
    if not loads_sae(method) or not params.get("path"):
        return
    named = [layers] if isinstance(layers, int) else list(layers) if isinstance(layers, Sequence) and not \
        isinstance(layers, str) else [layers]
    numbers = [l for l in named if isinstance(l, int) and not isinstance(l, bool) and l >= 0]
    for layer in dict.fromkeys(numbers):  # the method's own check, at that site
        SAEMethod(**{k: v for k, v in at_site(method, params, layer, model).items() if k in ("path", "model", "layer")})
    if len(numbers) == len(named):
        return
    path, model = str(params["path"]), params.get("model") or model
    pattern = "*".join(glob.escape(part) for part in str(Path(path).expanduser()).split(saelens.LAYER_FIELD))
    folders = sorted(glob.glob(pattern)) if saelens.LAYER_FIELD in path else [path]
    for folder in folders:
        if saelens.LAYER_FIELD in path and not (Path(folder) / saelens.CFG).is_file():
            continue  # not an SAE folder of the pattern
        saelens.check_recorded(saelens.read_cfg(folder), f"folder {folder}", model=model)
