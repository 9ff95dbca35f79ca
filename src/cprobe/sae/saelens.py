"""SAEs in SAELens's folder format, the one released SAEs use: ``cfg.json`` + ``sae_weights.safetensors``, read and
written as SAELens 6 reads and writes them (tested against SAELens :data:`FORMAT_VERSION`, docs/sae.md).

The weights file holds ``W_enc`` (d_in, d_sae), ``b_enc``, ``W_dec`` (d_sae, d_in), ``b_dec`` and, for JumpReLU,
``threshold``; any other tensor is refused (SAELens's strict load refuses it too), except a ``scaling_factor`` of
ones, which SAELens drops. ``cfg.json`` is read in SAELens's two formats, told apart as SAELens does, by
``sae_lens_version`` (top level or under ``metadata``):

- SAELens 6 (version >= 6): ``architecture`` alone picks the SAE — ``standard`` (ReLU), ``topk`` (with ``k`` and
  ``rescale_acts_by_decoder_norm``), ``jumprelu``; ``model_name`` / ``hook_name`` under ``metadata``.
- older (no version, or < 6): SAELens's own conversion — ``hook_point`` is ``hook_name``, ``activation_fn_str`` is
  ``activation_fn``, an ``activation_fn`` of ``topk`` with ``activation_fn_kwargs.k`` makes a TopK SAE with that k,
  a boolean ``normalize_activations`` is ``expected_average_only_in`` when true; ``model_name`` / ``hook_name`` at the
  top level. (For the checks below the names are also taken from the other place when missing from SAELens's.)

Both: ``d_in``, ``d_sae`` (checked against the weights), ``apply_b_dec_to_input`` (default true). Refused in one
line: another architecture (``gated``, ``abstopk``, transcoders), ``normalize_activations`` other than ``none``,
``reshape_activations`` other than ``none`` or a ``hook_head_index`` (attention-head SAEs), a TopK without ``k``. A
TopK with ``rescale_acts_by_decoder_norm: true`` (SAELens's training default) scales the pre-activations by the
decoder rows' norms before TopK and the latents back by them before decoding; that is the SAE with the norms folded
into its weights (``W_enc · n``, ``b_enc · n``, ``W_dec / n``; SAELens's ``fold_W_dec_norm``), which is what
:func:`load` returns. Only a local folder is read: no hub.

:func:`save` writes what SAELens 6's ``SAE.save_model`` writes, with no null key: the SAE's settings, ``metadata``
with ``sae_lens_version`` (:data:`FORMAT_VERSION`) and the ``model_name`` / ``hook_name`` it was trained on where
known (a cprobe layer ``k`` is TransformerLens's ``blocks.{k-1}.hook_resid_post`` = ``blocks.{k}.hook_resid_pre``;
docs/architecture.md). :func:`check_recorded` refuses, in one line, an SAE recorded for another model or hook than
the site it is used at, :func:`check_width` one of the wrong width for the states.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.io import atomic_save_tensors, write_json
from cprobe.sae.dictionary import SAE

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec")
FORMAT_VERSION = "6.54.12"
"""The SAELens version whose ``cfg.json`` keys :func:`save` writes (``metadata.sae_lens_version``) and that the tests
load cprobe's folders with (tests/data/saelens/README.md)."""
ARCHITECTURE = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}
"""SAELens's architecture of each activation cprobe runs."""
LAYER_FIELD = "{layer}"
"""In an SAE ``path``, replaced by the site's layer: one folder per layer (``path=DIR/layer_{layer}``)."""


def read_cfg(folder: str | Path) -> dict[str, Any]:
    """``cfg.json`` of the SAE folder ``folder``, read as SAELens reads it (module doc) without reading the weights,
    with cprobe's keys added: ``model_name`` / ``hook_name`` (None when not recorded), ``activation`` (relu / topk /
    jumprelu), ``k`` and ``rescale`` (TopK's ``rescale_acts_by_decoder_norm``). A one-line ConfigError otherwise."""
    folder = Path(folder).expanduser()
    missing = [n for n in (CFG, WEIGHTS) if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"SAE folder {folder} lacks {' and '.join(missing)} (SAELens format: {CFG} + {WEIGHTS})")
    try:
        cfg = json.loads((folder / CFG).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"SAE folder {folder}: cannot read {CFG} ({type(e).__name__}: {e})") from None
    meta = (cfg.get("metadata") or {}) if isinstance(cfg, dict) else None
    if not isinstance(meta, dict):
        raise ConfigError(f"SAE folder {folder}: {CFG} must hold an object with an object `metadata`")
    v6 = _major(cfg.get("sae_lens_version") or meta.get("sae_lens_version")) >= 6
    # SAELens 6 reads the names from metadata, older formats from the top level; the other place is read too, as
    # the names only serve the checks
    first, then = (meta, cfg) if v6 else (cfg, meta)
    for name in ("model_name", "hook_name"):
        cfg[name] = first.get(name) or then.get(name) or (cfg.get("hook_point") if name == "hook_name" else None)
    cfg["activation"], cfg["k"] = _activation(cfg, v6, folder)
    cfg["rescale"] = cfg["activation"] == "topk" and bool(cfg.get("rescale_acts_by_decoder_norm", False))
    norm = cfg.get("normalize_activations")
    norm = ("expected_average_only_in" if norm else "none") if isinstance(norm, bool) else str(norm or "none")
    if norm != "none":
        raise ConfigError(f"SAE folder {folder}: normalize_activations={norm!r} is not supported (only 'none')")
    reshape = str(cfg.get("reshape_activations") or "none")
    head = next((d[k] for d in (cfg, meta) for k in ("hook_head_index", "hook_point_head_index")
                 if d.get(k) is not None), None)
    if reshape != "none" or head is not None:
        raise ConfigError(f"SAE folder {folder}: an attention-head SAE (reshape_activations={reshape!r}, "
                          f"hook_head_index={head!r}) is not supported; cprobe reads residual-stream states")
    return cfg


def _major(version: Any) -> int:
    m = re.match(r"\s*(\d+)", str(version or ""))
    return int(m.group(1)) if m else 0


def _activation(cfg: dict[str, Any], v6: bool, folder: Path) -> tuple[str, int | None]:
    """(activation, TopK's k) as SAELens picks its SAE class (module doc)."""
    arch = cfg.get("architecture")
    if v6 and not arch:
        raise ConfigError(f"SAE folder {folder}: {CFG} of SAELens 6 lacks `architecture`")
    arch, k = str(arch or "standard"), cfg.get("k")
    if not v6:
        fn = str(cfg.get("activation_fn") or cfg.get("activation_fn_str") or "relu").lower()
        kwargs_k = (cfg.get("activation_fn_kwargs") or {}).get("k")
        if fn == "topk" and kwargs_k is not None:
            arch, k = "topk", kwargs_k
        elif fn not in ("relu", "topk") or (fn == "topk" and arch != "topk"):
            raise ConfigError(f"SAE folder {folder}: activation {fn!r} with architecture {arch!r} is not supported "
                              "(relu; topk with activation_fn_kwargs.k)")
    if arch == "topk":
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"SAE folder {folder}: a TopK SAE needs an integer k >= 1 in {CFG}, got {k!r}")
        return "topk", k
    if arch in ("standard", "jumprelu"):
        return {v: k for k, v in ARCHITECTURE.items()}[arch], None
    raise ConfigError(f"SAE folder {folder}: architecture {arch!r} is not supported (standard, topk, jumprelu)")


def load(folder: str | Path) -> SAE:
    """The SAE in ``folder`` (module doc): the function SAELens computes from it, in float32; a one-line ConfigError
    for a missing folder or file, an unreadable or inconsistent one, or an SAE cprobe does not run."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    cfg = read_cfg(folder)
    try:
        tensors = {k: v.float() for k, v in load_file(str(folder / WEIGHTS)).items()}
    except (OSError, ValueError, SafetensorError) as e:
        raise ConfigError(f"SAE folder {folder}: cannot read {WEIGHTS} ({type(e).__name__}: {e})") from None
    scaling = tensors.pop("scaling_factor", None)
    if scaling is not None and not bool((scaling == 1).all()):
        raise ConfigError(f"SAE folder {folder}: a scaling_factor other than 1 (SAELens 5's finetuning scale) is "
                          "not supported")
    want = (*TENSORS, "threshold") if cfg["activation"] == "jumprelu" else TENSORS
    if absent := [n for n in want if n not in tensors]:
        raise ConfigError(f"SAE folder {folder}: {WEIGHTS} lacks {absent}")
    if extra := sorted(set(tensors) - set(want)):
        raise ConfigError(f"SAE folder {folder}: {WEIGHTS} holds {extra}, which a {ARCHITECTURE[cfg['activation']]} "
                          f"SAE does not have (it has {list(want)})")
    W_enc, b_enc, W_dec = tensors["W_enc"], tensors["b_enc"], tensors["W_dec"]
    if cfg["rescale"]:
        if W_dec.ndim != 2 or W_enc.shape != W_dec.T.shape or b_enc.shape != W_dec.shape[:1]:
            raise ConfigError(f"SAE folder {folder}: W_enc {tuple(W_enc.shape)}, b_enc {tuple(b_enc.shape)} and "
                              f"W_dec {tuple(W_dec.shape)} do not fit together")
        W_enc, b_enc, W_dec = fold_decoder_norms(W_enc, b_enc, W_dec)
    try:
        sae = SAE(W_enc=W_enc, b_enc=b_enc, W_dec=W_dec, b_dec=tensors["b_dec"], activation=cfg["activation"],
                  k=cfg["k"], threshold=tensors.get("threshold"),
                  apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
                  model_name=cfg["model_name"], hook_name=cfg["hook_name"])
    except ValueError as e:
        raise ConfigError(f"SAE folder {folder}: {e}") from None
    for key, have in (("d_in", sae.d_in), ("d_sae", sae.d_sae)):
        if key in cfg and int(cfg[key]) != have:
            raise ConfigError(f"SAE folder {folder}: {CFG} says {key}={cfg[key]} but the weights have {have}")
    return sae


def fold_decoder_norms(W_enc: Tensor, b_enc: Tensor, W_dec: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The TopK SAE with ``rescale_acts_by_decoder_norm`` as one without it: with n_j = ‖W_dec,j‖ (at least 1e-8,
    as SAELens), ``(W_enc · n, b_enc · n, W_dec / n)``. Its pre-activations are the rescaled ones, ``pre · n``, so TopK
    picks the same latents with the same values, and ``f W_dec / n`` is the rescaled decode ``(f / n) W_dec``."""
    n = W_dec.norm(dim=-1).clamp(min=1e-8)
    return W_enc * n[None, :], b_enc * n, W_dec / n[:, None]


def save(sae: SAE, folder: Path) -> None:
    """``sae`` written into the existing directory ``folder`` as SAELens 6's ``save_model`` writes it (module doc)."""
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        tensors["threshold"] = sae.threshold
    atomic_save_tensors(folder / WEIGHTS, {k: v.float().contiguous() for k, v in tensors.items()})
    write_json(folder / CFG, saelens_cfg(sae))


def saelens_cfg(sae: SAE) -> dict[str, Any]:
    """The ``cfg.json`` of ``sae``: SAELens 6's ``SAEConfig.to_dict()`` keys in its order, no null value."""
    meta: dict[str, Any] = {"sae_lens_version": FORMAT_VERSION}
    meta.update({k: v for k, v in (("model_name", sae.model_name), ("hook_name", sae.hook_name)) if v is not None})
    cfg: dict[str, Any] = {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu",
                           "apply_b_dec_to_input": bool(sae.apply_b_dec_to_input), "normalize_activations": "none",
                           "reshape_activations": "none", "metadata": meta}
    if sae.activation == "topk":
        cfg.update(k=int(sae.k or 0), rescale_acts_by_decoder_norm=False)
    cfg["architecture"] = ARCHITECTURE[sae.activation]
    return cfg


_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|post)$")


def hook_layer(hook_name: str) -> int | None:
    """The cprobe layer of a residual-stream hook name (``blocks.i.hook_resid_pre`` → i, ``…_post`` → i + 1); None
    for any other hook."""
    m = _HOOK.match(hook_name)
    return None if m is None else int(m.group(1)) + (m.group(2) == "post")


def layer_hook(layer: int) -> str:
    """The hook name cprobe records for its layer ``layer``: ``blocks.{layer-1}.hook_resid_post`` (the block's
    output, as cprobe's layers are), ``blocks.0.hook_resid_pre`` for layer 0 (the embeddings)."""
    if layer < 0:
        raise ValueError(f"a resolved layer is >= 0, got {layer}")
    return f"blocks.{layer - 1}.hook_resid_post" if layer else "blocks.0.hook_resid_pre"


def at_layer(path: str | Path, layer: int) -> str:
    """``path`` with :data:`LAYER_FIELD` replaced by ``layer``."""
    return str(path).replace(LAYER_FIELD, str(layer))


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
    """One line when the SAE whose :func:`read_cfg` is ``cfg`` records another model than ``model`` or another hook
    than cprobe's layer ``layer`` (each checked when both sides are known; a hook that is not the residual stream is
    never layer ``layer``)."""
    recorded_model, hook = cfg.get("model_name"), cfg.get("hook_name")
    if model and recorded_model and _plain(model) != _plain(str(recorded_model)):
        raise ConfigError(f"SAE {where} was trained on model {recorded_model!r} ({CFG} model_name), not {model!r} "
                          "(set the SAE method's `model` to the recorded name if they are one model)")
    if layer is not None and hook and hook_layer(str(hook)) != layer:
        raise ConfigError(f"SAE {where} was trained at hook {hook!r} ({CFG} hook_name), not at layer {layer} "
                          f"({layer_hook(layer)}); give the SAE of that layer (path=DIR/layer_{LAYER_FIELD} loads one "
                          "per layer)")
