"""Load a model + tokenizer by hub name, local checkpoint (a Hugging Face folder or a GGUF file), installed package,
or the project's tiny models.

The ``model`` config node is parsed once into :class:`ModelConfig` (unknown keys rejected). Its ``source`` picks a
:class:`ModelSource` of :data:`MODEL_SOURCES`: where the weights come from, and the ``model.*`` keys that source reads;
a key it does not read, set to anything but its default, is refused in one line naming the sources that do read it
(it would be silently ignored: ``model.path`` on a model cprobe trains). Loading is safetensors-only with
``trust_remote_code`` off by default; offline, a model that is neither local nor in the Hugging Face cache fails fast
with instructions. :func:`peek_n_layers` reads a model's layer count from its config file without loading weights, so
layer specs are checked before any heavy work (a GGUF's from its header).

:func:`resolve_path` says where a model's files are: a GGUF (``model.path`` a ``.gguf`` file, a folder holding one,
or a package shipping one) is dequantised once into the model cache (:mod:`cprobe.models.gguf`) and read from there
as a checkpoint folder. ``source: local`` (``model=local``) takes any local checkpoint and reads its kind from it
(``kind: auto``); a model config without a ``name`` is named after its folder or file (:func:`named`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch

from cprobe.config import parse
from cprobe.errors import ConfigError, CprobeError, ModelLoadError
from cprobe.models import gguf
from cprobe.models.adapter import ModelAdapter
from cprobe.models.bos import check_setting, start_token
from cprobe.models.placement import check_placement, check_placement_for
from cprobe.registry import Registry

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` config node (see ``conf/model/*.yaml``)."""

    name: str
    source: str = "hub"  # a name of MODEL_SOURCES
    path: str | None = None  # hub id, local folder or .gguf file (source hub); a local folder or .gguf file (local)
    gguf_file: str | None = None  # the GGUF file to read in a folder (model.path) or package holding several
    package: str | None = None  # Python package shipping the weights (source package)
    install: str | None = None  # the command that installs `package` (the one-line error when it is missing)
    subdir: str = ""
    kind: Literal["mlm", "causal", "encoder", "classifier", "auto"] = "mlm"  # auto: read from the checkpoint
    bos: str = "auto"  # a causal LM's start token: auto | none | a token (cprobe.models.bos)
    revision: str | None = None
    dtype: Literal["float32", "fp32", "bfloat16", "bf16"] = "float32"
    device: str = "auto"
    device_map: str | dict | None = None  # accelerate: auto | balanced | balanced_low_0 | sequential | {module: device}
    max_memory: dict | None = None  # caps of an automatic device map, e.g. {0: 20GiB, cpu: 60GiB}
    offload_dir: str | None = None  # folder for weights a device map puts on disk
    batch_size: int = 32
    batch_tokens: int | None = None  # padded tokens per batch (rows x longest row); None: rows only (batch_size)
    max_length: int = 256
    trust_remote_code: bool = False
    allow_bin: bool = False  # also accept pickle-based .bin weights (only for files you trust)
    layers_path: str | None = None
    tiny: dict | None = None  # source tiny: what the project trains (see cprobe.models.tiny)
    task_defaults: dict[str, dict] | None = None  # per-model defaults of a task's settings, under the task's name
    finetune: dict | None = None  # per-model fine-tuning defaults when a study trains a classifier on it (CEBaB)
    members: list | None = None  # source zoo: the models of a set (model config names or inline model configs)
    fact_world: dict | None = None  # source fact_world: a tiny LM trained on a fact world's corpus (cprobe.models.zoo)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"model.batch_size must be >= 1, got {self.batch_size}")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise ValueError(f"model.batch_tokens must be >= 1 (or null), got {self.batch_tokens}")
        if self.max_length < 2:
            raise ValueError(f"model.max_length must be >= 2, got {self.max_length}")
        needs = MODEL_SOURCES.get(self.source).needs
        if needs and getattr(self, needs[0]) in (None, "", []):  # an empty node ({}) means its defaults
            raise ValueError(f"a source: {self.source} model needs {needs[1]}")

    @property
    def reads_as_set(self) -> str | None:
        """What this model config is when it is not one loadable model (read only by a task with the ``model_sets``
        capability), else None."""
        source = MODEL_SOURCES.get(self.source)
        return None if source.locate else source.what


def parse_model_config(cfg: Mapping[str, Any]) -> ModelConfig:
    if any(isinstance(v, str) and "${" in v for v in cfg.values()):  # a shipped YAML read without Hydra
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True)  # type: ignore[assignment]
    mc = parse(ModelConfig, named(cfg), "model")
    check_read(mc, cfg)
    check_device(mc.device)
    check_placement(mc)
    check_setting(mc.bos, mc.kind, mc.name)
    if mc.gguf_file and not (mc.source == "package" or (mc.path and _looks_local(mc.path))):
        raise ConfigError(f"model {mc.name!r}: model.gguf_file picks a GGUF in a local folder or package; set "
                          "model.path to the folder holding it")
    return mc


def named(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with a name: a model config without one (``model=local``) is named after its GGUF file or checkpoint
    folder."""
    if cfg.get("name"):
        return dict(cfg)
    path = str(cfg.get("path") or "")
    if not path:
        raise ConfigError("model=local needs model.path=DIR (a Hugging Face checkpoint folder) or FILE.gguf")
    base = Path(str(cfg.get("gguf_file") or path.rstrip("/"))).expanduser()
    return {**cfg, "name": base.name.removesuffix(gguf.SUFFIX) or "local"}


_DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.default is not MISSING}


def check_read(mc: ModelConfig, cfg: Mapping[str, Any]) -> None:
    """Refuse a ``model.*`` key that ``mc``'s source does not read (:attr:`ModelSource.reads`) set to anything but its
    default: it would be silently ignored. Keys every model config file carries at their defaults (``device_map:
    null`` on a tiny model) pass; the one line names, for each key, the sources that read it."""
    source = MODEL_SOURCES.get(mc.source)
    unread = sorted(k for k, v in cfg.items() if k not in source.reads and v != _DEFAULTS.get(k, MISSING))
    if not unread:
        return
    said = "; ".join(f"model.{k} is read only by models with source {'/'.join(readers(k))}" for k in unread)
    them = "it" if len(unread) == 1 else "them"
    example = next((f" (e.g. model={name})" for name, src in shipped_sources() if set(unread) <= src.reads), "")
    drop = ", ".join(f"model.{k}" for k in unread)
    raise ConfigError(f"{said}; model {mc.name!r} (source: {mc.source}) is {source.what} and would ignore {them}: pick "
                      f"a model=... whose source reads {them}{example}, or drop {drop}")


def readers(key: str) -> list[str]:
    """The model sources that read ``model.<key>``."""
    return [n for n in MODEL_SOURCES.names() if key in MODEL_SOURCES.get(n).reads]


def shipped_sources() -> Iterator[tuple[str, ModelSource]]:
    """(name, source) of every model config shipped in ``conf/model/``, by name."""
    from omegaconf import OmegaConf

    from cprobe.paths import config_dir

    for path in sorted((config_dir() / "model").glob("*.yaml")):
        source = OmegaConf.load(path).get("source", "hub")
        if source in MODEL_SOURCES.names():
            yield path.stem, MODEL_SOURCES.get(source)


def check_device(device: str) -> None:
    """Syntax of a device setting: auto | cpu | cuda | cuda:<i>."""
    if device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()):
        return
    raise ConfigError(f"unknown device {device!r}; choose from ['auto', 'cpu', 'cuda', 'cuda:<i>']")


def check_device_available(device: str) -> None:
    """ConfigError when ``device`` names a CUDA device this machine does not have."""
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ConfigError(f"device={device} but no CUDA device is available; use device=cpu or device=auto "
                          "(or compute=cpu)")
    index = int(device[5:]) if device.startswith("cuda:") else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device={device} but only {torch.cuda.device_count()} CUDA device(s) are visible "
                          f"(cuda:0 … cuda:{torch.cuda.device_count() - 1}; CUDA_VISIBLE_DEVICES renumbers them)")


def resolve_device(device: str) -> torch.device:
    """``auto`` (the GPU when there is one), ``cpu``, ``cuda`` or ``cuda:<i>``, checked against the visible GPUs."""
    check_device(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_available(device)
    return torch.device(device)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host accepts a TCP connection: without it, downloads only retry for a minute."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")


def _package_dir(mc: ModelConfig) -> Path:
    spec = importlib.util.find_spec(str(mc.package))
    if spec is None or spec.origin is None:
        install = mc.install or f"pip install {str(mc.package).replace('_', '-')}"
        raise ModelLoadError(f"model {mc.name!r} needs the Python package {mc.package!r}; install it with `{install}`")
    return Path(spec.origin).parent / mc.subdir


def _looks_local(path: str) -> bool:
    """A model.path that names a file or folder of this machine rather than a hub id."""
    return (path.startswith(("/", "./", "../", "~")) or path.endswith(gguf.SUFFIX) or Path(path).expanduser().exists())


def _located(mc: ModelConfig) -> tuple[Path | None, gguf.Source | None]:
    """Where a hub, local or package model's files are: (a checkpoint folder, None), (None, a GGUF), or (None, None)
    for a hub id. A local path that does not exist, a file that is not a GGUF, or a package holding no checkpoint is
    a one-line error."""
    what = f"model {mc.name!r}"
    if mc.source == "package":
        folder = _package_dir(mc)
        if (folder / "config.json").is_file() and not mc.gguf_file:
            return folder, None
        src = gguf.in_folder(folder, mc.gguf_file, what) if folder.is_dir() else None
        if src is None:
            src = gguf.in_package(importlib.import_module(str(mc.package)))
        if src is None:
            raise ModelLoadError(f"{what}: package {mc.package!r} holds no checkpoint (no config.json or .gguf in "
                                 f"{folder}); check model.package and model.subdir")
        return None, src
    if not mc.path:
        raise ConfigError(f"{what}: set model.path to a hub id, a local checkpoint folder or a .gguf file")
    path = Path(mc.path).expanduser()
    if path.is_file():
        if path.suffix != gguf.SUFFIX:
            raise ModelLoadError(f"{what}: model.path {mc.path} is a file, not a checkpoint; point it at a Hugging "
                                 "Face checkpoint folder or a .gguf file")
        return None, gguf.Source(path.name, (path,))
    if path.is_dir():
        if mc.gguf_file or not (path / "config.json").is_file():
            src = gguf.in_folder(path, mc.gguf_file, what)
            if src is not None:
                return None, src
        return path, None
    if mc.source == "local" or _looks_local(mc.path):
        raise ModelLoadError(f"{what}: model.path {mc.path} does not exist; point it at a Hugging Face checkpoint "
                             "folder or a .gguf file")
    return None, None


def _unavailable(mc: ModelConfig, path: str) -> ModelLoadError:
    return ModelLoadError(
        f"model {path!r} is not in the local Hugging Face cache and the hub is unreachable; on a connected machine "
        f"run `huggingface-cli download {path}` (then copy ~/.cache/huggingface), or set model.path=/local/dir")


def _check_local_dir(mc: ModelConfig, path: Path) -> None:
    files = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model {mc.name!r}: {path} has no config.json (it holds {files[:8] or 'nothing'}); point "
                             "model.path at a Hugging Face checkpoint directory (config.json, model.safetensors, "
                             "tokenizer files) or a .gguf file")
    weights = [f for f in files if f.endswith(".safetensors") or (mc.allow_bin and f.endswith(".bin"))]
    if not weights:
        bins = [f for f in files if f.endswith(".bin")]
        raise ModelLoadError(f"model {mc.name!r}: {path} holds no weights (no *.safetensors file; it holds "
                             f"{files[:8]}); " + (f"its {bins[:2]} are pickle files: set model.allow_bin=true if you "
                                                  "trust them" if bins else "copy the model's weights there"))


def peek_n_layers(cfg: Mapping[str, Any], cache_root: Path, data_root: Path | None = None) -> int | None:
    """The model's number of blocks from its config file, without loading weights (None when unknowable
    before a download, or for a model set). Raises the same fail-fast error as loading when the model cannot be
    had."""
    mc = parse_model_config(cfg)
    peek = MODEL_SOURCES.get(mc.source).peek
    return peek(mc) if peek else None


def resolve_path(cfg: Mapping[str, Any], cache_root: Path, progress: bool = True,
                 data_root: Path | None = None) -> str:
    """The hub id or local directory to pass to ``from_pretrained``."""
    mc = parse_model_config(cfg)
    source = MODEL_SOURCES.get(mc.source)
    if source.locate is None:
        raise ConfigError(f"model {mc.name!r} is {source.what}, not one model to load; only a study that reads model "
                          "sets loads its models (+experiment=lama_bias)")
    return source.locate(mc, cache_root, progress, data_root)


# ------------------------------------------------------------------------------------------------ model sources
@dataclass(frozen=True)
class ModelSource:
    """One ``model.source`` (a name of :data:`MODEL_SOURCES`).

    ``reads``: every ``model.*`` key the source reads — :func:`check_read` refuses any other key a config sets to
    anything but its default. ``locate(mc, cache_root, progress, data_root)``: the hub id or directory
    ``from_pretrained`` reads (it may train the model first); None for a source that is not one model but a set, read
    only by a task with the ``model_sets`` capability. ``peek(mc)``: the number of blocks without loading weights
    (None: unknowable before the model exists). ``needs``: the key it cannot do without, and how to say it."""

    what: str  # what a model of this source is, in messages: "... is <what>"
    reads: frozenset[str]
    locate: Callable[[ModelConfig, Path, bool, Path | None], str] | None = None
    peek: Callable[[ModelConfig], int | None] | None = None
    needs: tuple[str, str] | None = None


LOADED = frozenset({"name", "source", "kind", "bos", "dtype", "device", "device_map", "max_memory", "offload_dir",
                    "batch_size", "batch_tokens", "max_length", "layers_path", "task_defaults", "finetune"})
"""The ``model.*`` keys read for every model that is loaded, whatever its source: the loader's class and dtype, the
placement, the adapter's batching and blocks, and a study's per-model defaults (``task_defaults``, ``finetune``)."""


def _locate_files(mc: ModelConfig, cache_root: Path, progress: bool, data_root: Path | None) -> str:
    """A hub, local or package model's checkpoint folder (a GGUF's: dequantised once into the cache), or its hub id."""
    path, src = _located(mc)
    if src is not None:
        return str(gguf.dequantised(src, cache_root, f"model {mc.name!r}"))
    return str(path) if path is not None else str(mc.path)


def _peek_files(mc: ModelConfig) -> int | None:
    """A hub, local or package model's blocks: from a GGUF's header (checked: truncated, unreadable), a folder's
    config.json, or the hub cache's config (None when it must be downloaded first)."""
    path, src = _located(mc)
    if src is not None:
        return gguf.read_header(src, f"model {mc.name!r}").block_count
    if path is not None:
        _check_local_dir(mc, path)
        try:
            config = json.loads((path / "config.json").read_text())
            return next((int(config[k]) for k in ("num_hidden_layers", "n_layer", "num_layers") if k in config), None)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"model {mc.name!r}: cannot read {path / 'config.json'} ({e})") from None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(mc.path), revision=mc.revision, local_files_only=True,
                                            trust_remote_code=mc.trust_remote_code)
        return int(config.num_hidden_layers)
    except (OSError, ValueError):
        if _offline() or not _hub_reachable():
            raise _unavailable(mc, str(mc.path)) from None
        return None


def _locate_tiny(mc: ModelConfig, cache_root: Path, progress: bool, data_root: Path | None) -> str:
    from cprobe.models.tiny import tiny_model_dir

    return str(tiny_model_dir(mc.name, dict(mc.tiny or {}), cache_root, progress, data_root))


def _peek_tiny(mc: ModelConfig) -> int:
    from cprobe.models.tiny import TinyTrainConfig

    return int((mc.tiny.get("train") or {}).get("layers", TinyTrainConfig().layers))  # type: ignore[union-attr]


MODEL_SOURCES: Registry[ModelSource] = Registry("model source")
"""Every ``model.source``, with the keys it reads: adding a source is one entry here (and its keys' fields in
:class:`ModelConfig`)."""
MODEL_SOURCES.register("hub", ModelSource(
    "loaded from model.path (a hub id, a local checkpoint folder or a .gguf file)",
    LOADED | {"path", "gguf_file", "revision", "trust_remote_code", "allow_bin"}, _locate_files, _peek_files))
MODEL_SOURCES.register("local", ModelSource(
    "loaded from model.path (a local checkpoint folder or a .gguf file)",
    LOADED | {"path", "gguf_file", "trust_remote_code", "allow_bin"}, _locate_files, _peek_files,
    needs=("path", "model.path=DIR (a Hugging Face checkpoint folder) or FILE.gguf")))
MODEL_SOURCES.register("package", ModelSource(
    "loaded from the Python package model.package",
    LOADED | {"package", "install", "subdir", "gguf_file", "trust_remote_code", "allow_bin"}, _locate_files,
    _peek_files, needs=("package", "`package:` (the Python package name)")))
MODEL_SOURCES.register("tiny", ModelSource(
    "trained by cprobe as model.tiny says", LOADED | {"tiny"}, _locate_tiny, _peek_tiny,
    needs=("tiny", "a `tiny:` node")))
MODEL_SOURCES.register("zoo", ModelSource(
    "a model zoo (a set of models)", frozenset({"name", "source", "members", "dtype", "device"}),
    needs=("members", "`members:` (model config names or inline model configs)")))  # dtype, device: inline members'
MODEL_SOURCES.register("fact_world", ModelSource(
    "a tiny LM trained on a fact world's corpus by the job that reads it", LOADED | {"fact_world"},
    needs=("fact_world", "a `fact_world:` node (corpus, train)")))


def _kind(mc: ModelConfig, path: str) -> str:
    """The model's kind: as set, or (``kind: auto``) read from its checkpoint's declared architectures."""
    if mc.kind != "auto":
        return mc.kind
    if Path(path).is_dir():
        config = json.loads((Path(path) / "config.json").read_text())
        archs, model_type = config.get("architectures") or [], str(config.get("model_type", ""))
    else:
        from transformers import AutoConfig

        c = _pretrained(mc, path, lambda local_only: AutoConfig.from_pretrained(
            path, revision=mc.revision, local_files_only=local_only, trust_remote_code=mc.trust_remote_code))
        archs, model_type = c.architectures or [], c.model_type
    for kind, ends in (("causal", ("ForCausalLM", "LMHeadModel")), ("mlm", ("ForMaskedLM",)),
                       ("classifier", ("ForSequenceClassification",)), ("encoder", ("Model",))):
        if any(str(a).endswith(ends) for a in archs):
            return kind
    raise ConfigError(f"model {mc.name!r}: cannot tell its kind from its config ({model_type or 'no model_type'}, "
                      f"architectures {archs}); set model.kind to causal, mlm, encoder or classifier")


def load_adapter(cfg: Mapping[str, Any], cache_root: Path, progress: bool = True,
                 data_root: Path | None = None) -> ModelAdapter:
    """Build a :class:`ModelAdapter` from a ``model`` config node (see ``conf/model/*.yaml``)."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )
    from transformers.utils import logging as hf_logging

    from cprobe.progress import interactive

    if not progress or not interactive():
        hf_logging.disable_progress_bar()
    from cprobe.cache import kind_dir
    from cprobe.compute import resolve_dtype
    from cprobe.models.batching import BatchLimits

    mc = parse_model_config(cfg)
    check_placement_for(mc, mc.device)
    device = resolve_device(mc.device) if mc.device_map is None else _map_main_device(mc)
    dtype = _DTYPES[resolve_dtype(mc.dtype, device)]  # bf16 on a CPU without native bf16: fp32, with one log line
    path = resolve_path(cfg, cache_root, progress, data_root)
    if Path(path).is_dir():
        _check_local_dir(mc, Path(path))
    kind = _kind(mc, path)
    auto = {"mlm": AutoModelForMaskedLM, "causal": AutoModelForCausalLM, "encoder": AutoModel,
            "classifier": AutoModelForSequenceClassification}[kind]
    kw = dict(revision=mc.revision, trust_remote_code=mc.trust_remote_code)
    placed: dict[str, Any] = {}
    if mc.device_map is not None:  # the final map from an empty copy of the model: checked before weights load
        from transformers import AutoConfig

        from cprobe.models.placement import plan_device_map

        config = _pretrained(mc, path, lambda local_only: AutoConfig.from_pretrained(
            path, local_files_only=local_only, **kw))
        placed = {"device_map": plan_device_map(auto, config, mc, mc.device, dtype)}
        if mc.offload_dir:
            Path(mc.offload_dir).expanduser().mkdir(parents=True, exist_ok=True)
            placed["offload_folder"] = str(Path(mc.offload_dir).expanduser())

    def _load(local_only: bool):
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local_only, **kw)
        start_token(tok, mc.bos, kind, mc.name)  # a bad model.bos: one line before the weights load
        return tok, auto.from_pretrained(path, dtype=dtype, local_files_only=local_only,
                                         use_safetensors=None if mc.allow_bin else True, **placed, **kw)

    tok, model = _pretrained(mc, path, _load)
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"model {path!r} has no fast tokenizer; cprobe needs offsets for word alignment")
    if placed:
        from cprobe.models.placement import describe

        log.info("model %s placed by model.device_map=%s: %s", mc.name, mc.device_map if isinstance(
            mc.device_map, str) else "{...}", describe(model))
    else:
        model.to(device)
    limits = BatchLimits(kind_dir(cache_root, "engine") / "batch_limits.json" if device.type == "cuda" else None)
    return ModelAdapter(model, tok, kind, mc.name, batch_size=mc.batch_size, layers_path=mc.layers_path,
                        max_length=mc.max_length, batch_tokens=mc.batch_tokens, limits=limits, bos=mc.bos,
                        weights=_weights(path, dtype))


def _weights(path: str, dtype: torch.dtype) -> str:
    """What the loaded weights are (:attr:`ModelAdapter.weights`): their dtype, or how a GGUF's were made."""
    run = str(dtype).removeprefix("torch.")
    made = gguf.info(Path(path)).get("weights") if Path(path).is_dir() else None
    return run if made is None else made if run == "float32" else f"{made}, run in {run}"


def _map_main_device(mc: ModelConfig) -> torch.device:
    """The device a device-mapped model takes its inputs on (placement.main_device), known before loading: the first
    GPU the map may use, else the CPU."""
    from cprobe.models.placement import allowed_gpus, map_device

    if isinstance(mc.device_map, Mapping):
        gpus = [d for d in (map_device(v, "") for v in mc.device_map.values()) if isinstance(d, int)]
        return torch.device(f"cuda:{gpus[0]}") if gpus else torch.device("cpu")
    allowed = allowed_gpus(mc.device)
    if allowed is None:
        allowed = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    return torch.device(f"cuda:{allowed[0]}") if allowed else torch.device("cpu")


def _pretrained(mc: ModelConfig, path: str, load: Any) -> Any:
    """``load(local_only)``: from the local dir or HF cache first, the hub only when reachable; every failure becomes
    one actionable line."""
    local = Path(path).is_dir()
    try:
        try:
            return load(True)  # cached or local: never touch the network
        except OSError:
            if local or _offline() or not _hub_reachable():
                raise
            os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "15")  # unreachable hub: fail in seconds, not minutes
            return load(False)
    except CprobeError:  # already one line (a bad model.bos)
        raise
    except Exception as e:  # noqa: BLE001 - every loading failure becomes one actionable line
        if local:
            msg = " ".join(str(e).split())[:300]
            raise ModelLoadError(f"cannot load model {mc.name!r} from {path} ({type(e).__name__}: {msg}); if a file "
                                 "there is corrupt or truncated, re-download or re-save the checkpoint") from None
        if isinstance(e, (OSError, ValueError)):
            raise _unavailable(mc, path) from None
        raise


def load_tokenizer(cfg: Mapping[str, Any], cache_root: Path, progress: bool = True, data_root: Path | None = None):
    """The model's (fast) tokenizer alone, resolved and checked as :func:`load_adapter` does."""
    from transformers import AutoTokenizer

    mc = parse_model_config(cfg)
    path = resolve_path(cfg, cache_root, progress, data_root)
    if Path(path).is_dir():
        _check_local_dir(mc, Path(path))
    tok = _pretrained(mc, path, lambda local_only: AutoTokenizer.from_pretrained(
        path, local_files_only=local_only, revision=mc.revision, trust_remote_code=mc.trust_remote_code))
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"model {path!r} has no fast tokenizer; cprobe needs offsets for word alignment")
    return tok


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(adapter: ModelAdapter) -> str:
    """Weights fingerprint: names, shapes, the first values and an integer sum of the bits of every parameter (cheap,
    content-based, on the model's own device). The sum is over the raw bits as integers, so it is the same on any
    number of threads and any device: a float sum's rounding depends on the reduction order, and gave a 1-thread
    SLURM task another fingerprint — another cache key — than a 2-thread local run of the same model."""
    from cprobe.models.placement import state_items

    h = hashlib.sha256(adapter.name.encode())
    for name, p in state_items(adapter.model):  # offloaded weights read back: the same as on one device
        flat = p.detach().flatten()
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(flat[:64].float().cpu().numpy().tobytes())
        bits = flat.contiguous().view(_INT_OF_SIZE[flat.element_size()])
        h.update(str(int(bits.sum(dtype=torch.int64))).encode())
    return h.hexdigest()[:16]


def untrained(adapter: Any, seed: int) -> Any:
    """A model of ``adapter``'s architecture with random-init weights (its own config's initialisation, seeded), on
    the same device and dtype, with the same tokenizer and start token: the untrained-model control."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from cprobe.models.adapter import ModelAdapter

    auto = AutoModelForCausalLM if adapter.kind == "causal" else AutoModelForMaskedLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(adapter.model.config)
    model.to(device=adapter.device, dtype=adapter.dtype)
    return ModelAdapter(model, adapter.tok, adapter.kind, f"{adapter.name} (untrained)",
                        batch_size=adapter.batch_size, max_length=adapter.max_length, batch_tokens=adapter.batch_tokens,
                        bos=adapter.bos or "none", weights="random init")
