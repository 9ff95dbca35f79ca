"""Models larger than one device: a Hugging Face accelerate device map across the visible GPUs, CPU and disk.

``model.device_map`` is null (the whole model on ``model.device``, the default), a strategy — ``auto`` /
``balanced`` / ``balanced_low_0`` / ``sequential``, accelerate's, within ``model.max_memory`` — or an explicit map
``{module: device}`` whose devices are a GPU index or ``cuda:<i>``, ``cpu`` or ``disk`` (``""`` names the whole model).
Modules on ``disk`` are read from ``model.offload_dir`` (or the checkpoint's safetensors) during the pass; with a GPU
in the map, ``cpu`` modules are kept in host memory and run on the first GPU (accelerate's offload).

The job's device bounds the map: ``device=cpu`` (``compute=cpu``) allows only ``cpu`` and ``disk``, ``cuda:<i>``
only that GPU (plus CPU and disk), ``cuda`` / ``auto`` every visible GPU. Everything is checked in one line before
any weights load: syntax when the config is parsed (:func:`check_placement`), the machine and the job's device at
validation (:func:`check_placement_for`), module names and whether an automatic map spills to disk without an offload
dir once the model's config is read (:func:`plan_device_map`, on an empty — meta — copy of the model).

The model engine (:class:`cprobe.models.adapter.ModelAdapter`) feeds inputs to the map's main device (the first GPU,
else the CPU: :func:`main_device`), runs each edit on the device of the module it hooks, and gathers what it reads
on the main device.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError

log = logging.getLogger(__name__)

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's automatic placements (``model.device_map=<strategy>``)."""

INSTALL = "pip install 'cprobe[scale]'"
_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|KIB|MB|MIB|GB|GIB|TB|TIB)?\s*$", re.IGNORECASE)


def accelerate_available() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def map_device(value: Any, where: str) -> int | str:
    """One device of a map: a GPU index (``0`` or ``cuda:0`` → 0), ``cpu`` or ``disk``."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int) and value >= 0:
        return value
    elif isinstance(value, str):
        v = value.strip().lower()
        if v in ("cpu", "disk"):
            return v
        if v.isdigit():
            return int(v)
        if v.startswith("cuda:") and v[5:].isdigit():
            return int(v[5:])
    raise ConfigError(f"{where}={value!r} is not a device; choose from ['cpu', 'disk', '<GPU index>', 'cuda:<i>']")


def _memory_key(key: Any, where: str) -> int | str:
    k = map_device(key, f"{where} key")
    if k == "disk":
        raise ConfigError(f"{where}: disk has no memory cap (modules that fit nowhere else go there); use GPU "
                          "indices and 'cpu' as keys")
    return k


def check_placement(mc: Any) -> None:
    """Syntax of ``model.device_map`` / ``max_memory`` / ``offload_dir`` (a :class:`~cprobe.models.load.ModelConfig`),
    ConfigError in one line; nothing about this machine is read."""
    dm = mc.device_map
    if dm is None:
        for key in ("max_memory", "offload_dir"):
            if getattr(mc, key) is not None:
                raise ConfigError(f"model.{key} is set but model.device_map is null; set model.device_map=auto (or a "
                                  "map {module: device}) to place the model across devices")
        return
    if isinstance(dm, str):
        if dm not in STRATEGIES:
            raise ConfigError(f"unknown model.device_map {dm!r}; choose from {list(STRATEGIES)} or a mapping "
                              "{module: device} (devices: GPU index, cuda:<i>, cpu, disk)")
    elif isinstance(dm, Mapping):
        if not dm:
            raise ConfigError("model.device_map is an empty mapping; give {module: device} entries or use "
                              "model.device_map=auto")
        devices = {str(k): map_device(v, f"model.device_map.{k}") for k, v in dm.items()}
        if "disk" in devices.values() and not mc.offload_dir:
            on_disk = [k or "''" for k, v in devices.items() if v == "disk"]
            raise ConfigError(f"model.device_map puts {on_disk[:3]}{' ...' if len(on_disk) > 3 else ''} on disk but "
                              "model.offload_dir is not set; set model.offload_dir=DIR (a folder for offloaded weights)")
        if mc.max_memory is not None:
            raise ConfigError("model.max_memory caps an automatic placement; with an explicit model.device_map it "
                              "would be ignored: drop it (or use model.device_map=auto)")
    else:
        raise ConfigError(f"model.device_map must be null, one of {list(STRATEGIES)} or a mapping {{module: device}}, "
                          f"got {dm!r}")
    for k, v in (mc.max_memory or {}).items():
        _memory_key(k, "model.max_memory")
        if isinstance(v, bool) or not (isinstance(v, int) and v > 0 or isinstance(v, str) and _SIZE.match(v)):
            raise ConfigError(f"model.max_memory.{k}={v!r} is not a size; use bytes or e.g. '20GiB', '500MB'")


def allowed_gpus(device: str) -> list[int] | None:
    """GPU indices a device map may use under the job's ``device``: none for ``cpu``, one for ``cuda:<i>``, every
    visible one for ``cuda`` / ``auto`` (None: any)."""
    if device == "cpu":
        return []
    if device.startswith("cuda:"):
        return [int(device[5:])]
    return None


def check_placement_for(mc: Any, device: str) -> None:
    """The map against the job's device (``model.device``, or the job's ``device`` when the model's is ``auto``) and
    this machine: accelerate installed, every GPU the map names visible and allowed. One line, before heavy work."""
    if mc.device_map is None:
        return
    if not accelerate_available():
        raise ConfigError(f"model.device_map needs Hugging Face accelerate; install it with `{INSTALL}`")
    dm = mc.device_map
    named = {map_device(v, "") for v in dm.values()} if isinstance(dm, Mapping) else set()
    named |= {_memory_key(k, "") for k in (mc.max_memory or {})}
    gpus = {d for d in named if isinstance(d, int)}
    allowed = allowed_gpus(device)
    if allowed is not None and gpus - set(allowed):
        what = "the job computes on the CPU (device=cpu / compute=cpu)" if not allowed else f"device={device}"
        raise ConfigError(f"model.device_map / max_memory place modules on GPU(s) {sorted(gpus - set(allowed))} but "
                          f"{what}; map them to {'cpu or disk' if not allowed else f'cuda:{allowed[0]}, cpu or disk'}, "
                          "or change the device")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda") and not visible:
        raise ConfigError(f"model.device_map with device={device} but no CUDA device is available; use device=cpu "
                          "(compute=cpu) to place the model on CPU and disk")
    missing = sorted(g for g in gpus | set(allowed or []) if g >= visible)
    if missing:
        raise ConfigError(f"model.device_map names GPU(s) {missing} but {visible} CUDA device(s) are visible "
                          "(CUDA_VISIBLE_DEVICES renumbers them)")
    if mc.offload_dir:
        check_offload_dir(Path(mc.offload_dir).expanduser())


OFFLOAD_FILES = ("index.json", "*.dat")
"""What accelerate writes into ``model.offload_dir``: the offloaded weights and their index."""


def check_offload_dir(d: Path) -> None:
    """ConfigError in one line unless ``d`` is new, empty, or holds only what an offload wrote (:data:`OFFLOAD_FILES`,
    which the next offload writes over): a user's files are never overwritten."""
    if not d.exists():
        return
    if not d.is_dir():
        raise ConfigError(f"model.offload_dir={d} is a file; give a folder for offloaded weights")
    other = sorted(p.name for p in d.iterdir() if not any(p.match(f) for f in OFFLOAD_FILES) or not p.is_file())
    if other:
        raise ConfigError(f"model.offload_dir={d} holds files an offload did not write ({', '.join(other[:3])}"
                          f"{' ...' if len(other) > 3 else ''}); give a new or empty folder for offloaded weights")


def _max_memory(mc: Any, device: str) -> dict[int | str, int | str]:
    """The caps of an automatic placement: ``model.max_memory`` as given (accelerate's meaning: only the devices it
    names), else what is free on every allowed GPU and the CPU."""
    if mc.max_memory is not None:
        return {_memory_key(k, "model.max_memory"): v for k, v in mc.max_memory.items()}
    from accelerate.utils import get_max_memory

    allowed = allowed_gpus(device)
    return {k: v for k, v in get_max_memory().items()
            if k == "cpu" or (isinstance(k, int) and (allowed is None or k in allowed))}


def plan_device_map(model_class: Any, config: Any, mc: Any, device: str, dtype: torch.dtype) -> dict[str, int | str]:
    """The final ``{module: device}`` map for loading, from an empty (meta) copy of the model: an explicit map is
    checked against the model's module names, a strategy is resolved by accelerate within the memory caps. Refuses,
    in one line, unknown or missing modules and an automatic map that spills to disk without ``model.offload_dir``."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from accelerate.utils import get_balanced_memory

    with init_empty_weights():
        empty = model_class.from_config(config, dtype=dtype)
    empty.tie_weights()  # tied weights stay together in an automatic map
    no_split = list(getattr(empty, "_no_split_modules", None) or [])
    dm = mc.device_map
    if isinstance(dm, str):
        caps = _max_memory(mc, device)
        if dm != "sequential":
            caps = get_balanced_memory(empty, max_memory=caps, no_split_module_classes=no_split, dtype=dtype,
                                       low_zero=dm == "balanced_low_0")
        plan = dict(infer_auto_device_map(empty, max_memory=caps, no_split_module_classes=no_split, dtype=dtype))
        if "disk" in plan.values() and not mc.offload_dir:
            n = sum(v == "disk" for v in plan.values())
            raise ConfigError(f"model {mc.name!r} does not fit in {_caps_text(caps)}: {n} module(s) would be offloaded "
                              "to disk; set model.offload_dir=DIR (or raise model.max_memory)")
    else:
        plan = {str(k): map_device(v, f"model.device_map.{k}") for k, v in dm.items()}
        names = {n for n, _ in empty.named_modules()}
        unknown = sorted(k for k in plan if k not in names)
        if unknown:
            top = [n for n, _ in empty.named_children()]
            raise ConfigError(f"model.device_map names unknown module(s) {unknown[:3]} of {mc.name!r}; its top "
                              f"modules are {top} (use dotted names, e.g. '{_example_block(empty)}', or '' for all)")
        uncovered = [n for n, _ in [*empty.named_parameters(), *empty.named_buffers()]
                     if not any(k == "" or n == k or n.startswith(k + ".") for k in plan)]
        if uncovered:
            raise ConfigError(f"model.device_map does not place {len(uncovered)} weight(s) of {mc.name!r}, e.g. "
                              f"{uncovered[:3]}; add their modules (or a parent, '' for the rest)")
    for target, source in (getattr(empty, "all_tied_weights_keys", None) or {}).items():
        where = (_device_in(plan, target), _device_in(plan, source))
        if None not in where and where[0] != where[1]:  # a tied weight offloaded apart from its source is not found
            raise ConfigError(f"model.device_map puts the tied weights {source} ({where[1]}) and {target} "
                              f"({where[0]}) on different devices; place their modules on one device")
    return plan


def _device_in(plan: Mapping[str, Any], name: str) -> Any:
    """The device the map gives a weight: its longest matching module prefix ('' matches everything)."""
    best = max((k for k in plan if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
    return plan[best] if best is not None else None


def _example_block(model: nn.Module) -> str:
    for n, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m):
            return f"{n}.0"
    return next((n for n, _ in model.named_children()), "")


def _caps_text(caps: Mapping[Any, Any]) -> str:
    def gib(v: Any) -> str:
        return f"{v / 2**30:.2f} GiB" if isinstance(v, (int, float)) else str(v)

    return "{" + ", ".join(f"{k}: {gib(v)}" for k, v in caps.items()) + "}"


# ----------------------------------------------------------------------------------------------- a loaded model
def device_map_of(model: nn.Module) -> dict[str, Any] | None:
    """The accelerate map a model (or the encoder a classifier wraps) was dispatched with; None when it was not."""
    for m in model.modules():
        dm = getattr(m, "hf_device_map", None)
        if dm:
            # one device and no offload: accelerate moved the model there without hooks, as `.to(device)` does
            return dict(dm) if len(set(dm.values())) > 1 or "disk" in dm.values() else None
    return None


def dispatched(model: nn.Module) -> bool:
    """Whether the model was loaded with a device map that spans devices or offloads (accelerate's hooks move
    tensors between its modules)."""
    return device_map_of(model) is not None


def _torch_device(d: Any) -> torch.device:
    return torch.device(f"cuda:{d}" if isinstance(d, int) else d)


def _label(d: Any) -> str:
    return "disk" if d == "disk" else str(_torch_device(d))


def main_device(model: nn.Module) -> torch.device | None:
    """Where a dispatched model takes its inputs and returns its outputs: the first GPU of its map, else the CPU
    (accelerate's rule; ``cpu`` and ``disk`` modules run there too). None for a model on one device."""
    dm = device_map_of(model)
    if dm is None:
        return None
    gpus = [d for d in dm.values() if d not in ("cpu", "disk")]
    return _torch_device(gpus[0]) if gpus else torch.device("cpu")


def placement_label(model: nn.Module) -> str | None:
    """``cuda:0+cuda:1+cpu+disk``: the devices a dispatched model spans (None for one device)."""
    dm = device_map_of(model)
    return None if dm is None else "+".join(_label(d) for d in dict.fromkeys(dm.values()))


def describe(model: nn.Module) -> str:
    """One log line: how many modules each device holds."""
    dm = device_map_of(model) or {}
    counts = Counter(_label(d) for d in dm.values())
    return ", ".join(f"{n} module(s) on {d}" for d, n in counts.items())


def offloaded(model: nn.Module) -> bool:
    """Whether some weights are not resident (on disk, or in host memory for a GPU map): they are loaded into the
    pass module by module and cannot be trained."""
    return any(p.is_meta for p in model.parameters())


def require_resident(model: nn.Module, what: str) -> None:
    """ConfigError when ``what`` (e.g. fine-tuning) needs every weight resident and the model is offloaded."""
    if offloaded(model):
        raise ConfigError(f"{what} needs every weight of the model resident on a device, but model.device_map offloads "
                          f"part of it ({describe(model)}); use a map on GPUs and cpu only (no disk), or more "
                          "GPU memory (model.max_memory)")


def state_items(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``model.state_dict().items()`` with every offloaded tensor read back (module by module, on the CPU): the same
    names and values as the model loaded on one device."""
    state = model.state_dict()
    if not any(t.is_meta for t in state.values()):
        yield from state.items()
        return
    from accelerate.utils import align_module_device, has_offloaded_params

    for name, t in state.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if not t.is_meta or not has_offloaded_params(module):
            yield name, t
            continue
        with align_module_device(module, torch.device("cpu")):
            yield name, getattr(module, attr).detach().clone()
