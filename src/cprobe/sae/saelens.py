"""SAEs in SAELens's folder format, the one released SAEs use: ``cfg.json`` + ``sae_weights.safetensors``.

The weights file holds ``W_enc`` (d_in, d_sae), ``b_enc``, ``W_dec`` (d_sae, d_in), ``b_dec`` and, for JumpReLU,
``threshold``. From ``cfg.json`` cprobe reads ``d_in``, ``d_sae``, ``architecture`` (``standard`` = ReLU, ``topk``,
``jumprelu``; ``gated`` is refused), the activation (``activation_fn`` / ``activation_fn_str``, with TopK's ``k`` at
the top level or in ``activation_fn_kwargs``), ``apply_b_dec_to_input``, ``normalize_activations`` (only ``none`` is
supported) and ``model_name`` / ``hook_name`` (top level, or under ``metadata`` as SAELens 6 writes them). Only a
local folder is read: no hub. cprobe's own trained SAEs are written the same way (their cache entries load in SAELens).

:func:`check_recorded` refuses, in one line, an SAE trained on another model or at another layer than the one it is
used on (from ``cfg.json`` alone, when the method is built: at validation), :func:`check_width` one of the wrong
width for the states (a cprobe layer ``k`` is TransformerLens's ``blocks.{k-1}.hook_resid_post``
= ``blocks.{k}.hook_resid_pre``; docs/architecture.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cprobe.errors import ConfigError
from cprobe.io import atomic_save_tensors, write_json
from cprobe.sae.dictionary import SAE

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec")


def read_cfg(folder: str | Path) -> dict[str, Any]:
    """``cfg.json`` of the SAE folder ``folder``, checked without reading the weights: both files present, the
    architecture one cprobe runs, no input normalisation; ``model_name`` / ``hook_name`` lifted from ``metadata``.
    A one-line ConfigError otherwise."""
    folder = Path(folder).expanduser()
    missing = [n for n in (CFG, WEIGHTS) if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"SAE folder {folder} lacks {' and '.join(missing)} (SAELens format: {CFG} + {WEIGHTS})")
    try:
        cfg = json.loads((folder / CFG).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"SAE folder {folder}: cannot read {CFG} ({type(e).__name__}: {e})") from None
    meta = cfg.get("metadata") or {}
    cfg["model_name"], cfg["hook_name"] = cfg.get("model_name") or meta.get("model_name"), \
        cfg.get("hook_name") or meta.get("hook_name")
    cfg["activation"], cfg["k"] = _activation(cfg, folder)
    if str(cfg.get("normalize_activations") or "none") != "none":
        raise ConfigError(f"SAE folder {folder}: normalize_activations={cfg['normalize_activations']!r} is not "
                          "supported (only 'none')")
    return cfg


def load(folder: str | Path) -> SAE:
    """The SAE in ``folder`` (module doc); a one-line ConfigError for a missing folder or file, an unreadable or
    inconsistent one, or an architecture cprobe does not run."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    cfg = read_cfg(folder)
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError, SafetensorError) as e:
        raise ConfigError(f"SAE folder {folder}: cannot read {WEIGHTS} ({type(e).__name__}: {e})") from None
    if absent := [n for n in TENSORS if n not in tensors]:
        raise ConfigError(f"SAE folder {folder}: {WEIGHTS} lacks {absent}")
    try:
        sae = SAE(W_enc=tensors["W_enc"].float(), b_enc=tensors["b_enc"].float(), W_dec=tensors["W_dec"].float(),
                  b_dec=tensors["b_dec"].float(), activation=cfg["activation"], k=cfg["k"],
                  threshold=tensors["threshold"].float() if "threshold" in tensors else None,
                  apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
                  model_name=cfg["model_name"], hook_name=cfg["hook_name"])
    except ValueError as e:
        raise ConfigError(f"SAE folder {folder}: {e}") from None
    for key, have in (("d_in", sae.d_in), ("d_sae", sae.d_sae)):
        if key in cfg and int(cfg[key]) != have:
            raise ConfigError(f"SAE folder {folder}: {CFG} says {key}={cfg[key]} but the weights have {have}")
    return sae


def _activation(cfg: dict[str, Any], folder: Path) -> tuple[str, int | None]:
    arch = str(cfg.get("architecture") or "standard")
    fn = str(cfg.get("activation_fn") or cfg.get("activation_fn_str") or "").lower()
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    if arch == "topk" or fn == "topk":
        return "topk", int(k) if k is not None else None
    if arch == "jumprelu":
        return "jumprelu", None
    if arch == "standard" and fn in ("", "relu"):
        return "relu", None
    raise ConfigError(f"SAE folder {folder}: architecture {arch!r} with activation {fn or 'relu'!r} is not supported "
                      "(standard/relu, topk, jumprelu)")


def save(sae: SAE, folder: Path) -> None:
    """``sae`` written into the existing directory ``folder`` in the format :func:`load` reads (and SAELens does)."""
    arch = {"topk": "topk", "relu": "standard", "jumprelu": "jumprelu"}[sae.activation]
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        tensors["threshold"] = sae.threshold
    atomic_save_tensors(folder / WEIGHTS, {k: v.float().contiguous() for k, v in tensors.items()})
    cfg: dict[str, Any] = {"architecture": arch, "d_in": sae.d_in, "d_sae": sae.d_sae,
                           "activation_fn_str": "topk" if sae.activation == "topk" else "relu",
                           "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
                           "model_name": sae.model_name, "hook_name": sae.hook_name, "dtype": "float32"}
    if sae.activation == "topk":
        cfg["k"] = sae.k
        cfg["activation_fn_kwargs"] = {"k": sae.k}
    write_json(folder / CFG, cfg)


_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|post)$")


def hook_layer(hook_name: str) -> int | None:
    """The cprobe layer of a residual-stream hook name (``blocks.i.hook_resid_pre`` → i, ``…_post`` → i + 1); None
    for any other hook."""
    m = _HOOK.match(hook_name)
    return None if m is None else int(m.group(1)) + (m.group(2) == "post")


def _plain(name: str) -> str:
    """A model name compared across spellings: the last path part, lower case, letters and digits only
    (``google/gemma-3-270m`` and ``gemma3_270m`` are one name)."""
    return re.sub(r"[^a-z0-9]", "", name.rsplit("/", 1)[-1].lower())


def check_width(sae: SAE, d: int, where: str) -> None:
    """One line when ``sae`` cannot read states of width ``d``."""
    if sae.d_in != d:
        raise ConfigError(f"SAE {where} reads states of width {sae.d_in}, but the states here have width {d}: an SAE "
                          "of another width, for another model or layer")


def check_recorded(cfg: dict[str, Any], where: str, model: str | None = None, layer: int | None = None) -> None:
    """One line when the SAE whose :func:`read_cfg` is ``cfg`` records another model than ``model`` or another layer
    than ``layer`` (each checked when both sides are known)."""
    recorded_model, hook = cfg.get("model_name"), cfg.get("hook_name")
    if model and recorded_model and _plain(model) != _plain(recorded_model):
        raise ConfigError(f"SAE {where} was trained on model {recorded_model!r} ({CFG} model_name), not {model!r}")
    if layer is not None and hook and hook_layer(hook) != layer:
        raise ConfigError(f"SAE {where} was trained at hook {hook!r} ({CFG} hook_name), not at layer {layer} "
                          f"(blocks.{layer - 1}.hook_resid_post)")
