"""Load a model + tokenizer by hub name, local directory, installed package, or the project's tiny models."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from cprobe.errors import ConfigError, ModelLoadError
from cprobe.models.adapter import ModelAdapter

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_KINDS = ("mlm", "causal", "encoder")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device} but no CUDA device is available; use device=cpu or device=auto")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ConfigError(f"unknown device {device!r}; choose from ['auto', 'cpu', 'cuda', 'cuda:<i>']")
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


def resolve_path(cfg: Mapping[str, Any], cache_root: Path, progress: bool = True,
                 data_root: Path | None = None) -> str:
    """The hub id or local directory to pass to ``from_pretrained``."""
    source = cfg.get("source", "hub")
    if source == "tiny":
        from cprobe.data.registry import grammar_config
        from cprobe.models.tiny import TinyTrainConfig, ensure_tiny_model

        t = cfg["tiny"]
        if t.get("causalgym_corpus"):  # sentences generated from the CausalGym templates join the corpus
            from cprobe.causalgym.corpus import expand_model_cfg
            from cprobe.paths import data_dir

            t = expand_model_cfg(cfg, data_root or data_dir())["tiny"]
        try:
            train = TinyTrainConfig(**(t.get("train") or {}))
        except TypeError as e:
            raise ConfigError(f"bad model.tiny.train config: {e}") from None
        return str(ensure_tiny_model(
            t["kind"], grammar_config(t.get("grammar")), train,
            cache_root / "models", extra_sentences=tuple(t.get("extra_sentences", ())), progress=progress,
        ))
    if source == "package":
        spec = importlib.util.find_spec(cfg["package"])
        if spec is None or spec.origin is None:
            raise ModelLoadError(
                f"model {cfg['name']!r} needs the Python package {cfg['package']!r}; "
                f"install it with `pip install {cfg['package'].replace('_', '-')}`"
            )
        return str(Path(spec.origin).parent / cfg.get("subdir", ""))
    if source == "hub":
        if not cfg.get("path"):
            raise ConfigError(f"model {cfg['name']!r}: set model.path to a hub id or a local directory")
        return str(cfg["path"])
    raise ConfigError(f"unknown model source {source!r}; choose from ['hub', 'package', 'tiny']")


def load_adapter(cfg: Mapping[str, Any], cache_root: Path, progress: bool = True,
                 data_root: Path | None = None) -> ModelAdapter:
    """Build a :class:`ModelAdapter` from a ``model`` config node (see ``conf/model/*.yaml``)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()

    kind = cfg.get("kind", "mlm")
    if kind not in _KINDS:
        raise ConfigError(f"unknown model kind {kind!r}; choose from {list(_KINDS)}")
    dtype_name = str(cfg.get("dtype", "float32"))
    if dtype_name not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype_name!r}; choose from ['bfloat16', 'float32'] (fp16 on CPU is slow)")
    device = resolve_device(str(cfg.get("device", "auto")))
    path = resolve_path(cfg, cache_root, progress, data_root)
    auto = {"mlm": AutoModelForMaskedLM, "causal": AutoModelForCausalLM, "encoder": AutoModel}[kind]
    kw = dict(revision=cfg.get("revision"), trust_remote_code=bool(cfg.get("trust_remote_code", False)))
    local = Path(path).is_dir()

    def _load(local_only: bool):
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local_only, **kw)
        model = auto.from_pretrained(path, dtype=_DTYPES[dtype_name], local_files_only=local_only,
                                     use_safetensors=None if cfg.get("allow_bin") else True, **kw)
        return tok, model

    try:
        try:
            tok, model = _load(local_only=True)  # cached or local: never touch the network
        except OSError:
            if local or _offline() or not _hub_reachable():
                raise
            os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "15")  # unreachable hub: fail in seconds, not minutes
            tok, model = _load(local_only=False)
    except (OSError, ValueError) as e:
        if local:
            raise ModelLoadError(f"cannot load model {cfg['name']!r} from {path}: {str(e).splitlines()[0]}") from None
        raise ModelLoadError(
            f"model {path!r} is not in the local Hugging Face cache and the hub is unreachable; on a connected machine "
            f"run `huggingface-cli download {path}` (then copy ~/.cache/huggingface), or set model.path=/local/dir"
        ) from None
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"model {path!r} has no fast tokenizer; cprobe needs offsets for word alignment")
    model.to(device)
    return ModelAdapter(model, tok, kind, str(cfg["name"]), batch_size=int(cfg.get("batch_size", 32)),
                        layers_path=cfg.get("layers_path"), max_length=int(cfg.get("max_length", 256)))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")


def fingerprint(adapter: ModelAdapter) -> str:
    """Weights fingerprint: names, shapes and a sample of values of every parameter (cheap, content-based)."""
    h = hashlib.sha256(adapter.name.encode())
    for name, p in adapter.model.state_dict().items():
        flat = p.detach().flatten()
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(flat[:64].float().cpu().numpy().tobytes())
        h.update(flat.float().sum().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
