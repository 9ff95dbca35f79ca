"""MIB's format both ways (Mueller et al. 2025; ``MIB-causal-variable-track``): fitted featurizers written as an MIB
submission folder, MIB's verifier logic re-implemented, MIB's featurizer files read safely, and MIB's result JSON read
as the MIB study's table (so ``cprobe collect`` puts MIB's published numbers beside cprobe's).

**A submission** (MIB's README): ``{TASK}_{MODEL}_{VARIABLE}/`` folders (MIB's task id, the model's architecture
class, the variable), one triplet per model unit: ``{unit}_featurizer`` and ``{unit}_inverse_featurizer`` (torch
checkpoints ``{"model_info": …, "state_dict": …}`` as CausalAbstraction's ``Featurizer.save_modules`` writes them:
the module classes, ``n_features``, a subspace's ``rotation_matrix``) and ``{unit}_indices`` (JSON: the selected
features, ``null`` for all). The unit id is CausalAbstraction's ``ResidualStream(Layer-{l},Token-{position})``:
``block_input`` of layer l, which is cprobe's layer l (docs/architecture.md: layers and sites); cprobe's last layer
(the final norm's output) has no such unit and is not written. ``cprobe_submission.json`` beside the folders lists the
units, the token positions (MIB's ids, the same as MIB's baselines') and what cprobe fitted.

Every file cprobe writes is a plain dict of strings, numbers and tensors that ``torch.load(weights_only=True)``
reads; a file cprobe did not write is read only that way, and one that needs unpickling anything else is refused in
one line (:func:`read_checkpoint`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cprobe.errors import DataError
from cprobe.models.featurizers import Featurizer, Identity, Subspace

TASKS = {"ioi_task": ("output_token", "output_position"), "4_answer_MCQA": ("answer_pointer", "answer"),
         "ARC_easy": ("answer_pointer", "answer"), "arithmetic": ("ones_carry",),
         "ravel_task": ("Country", "Continent", "Language")}
"""MIB's verifier: its tasks and their variables."""
MODELS = ("GPT2LMHeadModel", "Qwen2ForCausalLM", "Gemma2ForCausalLM", "LlamaForCausalLM")
VALID = {("ioi_task", m) for m in MODELS} | {(t, m) for t in ("4_answer_MCQA",) for m in MODELS[1:]} | {
    (t, m) for t in ("ARC_easy", "arithmetic", "ravel_task") for m in MODELS[2:]}
"""MIB's valid (task, model) combinations."""
MODULES = ("SubspaceFeaturizerModule", "SubspaceInverseFeaturizerModule", "SAEFeaturizerModule",
           "SAEInverseFeaturizerModule", "IdentityFeaturizerModule", "IdentityInverseFeaturizerModule")
MANIFEST = "cprobe_submission.json"


def unit_id(layer: int, position: str) -> str:
    return f"ResidualStream(Layer-{layer},Token-{position})"


class _Rotate(torch.nn.Module):
    """pyvene's ``LowRankRotateLayer``'s state: ``weight`` (d, k), under torch's orthogonal parametrisation (what
    CausalAbstraction's ``SubspaceFeaturizer`` wraps); built here only to write a state dict MIB loads."""

    def __init__(self, basis: Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(basis.detach().float().clone(), requires_grad=False)


def checkpoints(featurizer: Featurizer | None) -> tuple[dict, dict] | None:
    """(featurizer file, inverse file) contents for ``featurizer`` (None: the whole vector, MIB's identity
    featurizer); None for one MIB does not save (an SAE's: MIB loads those from SAELens)."""
    if featurizer is None or isinstance(featurizer, Identity):
        info = {"featurizer_class": "IdentityFeaturizerModule", "inverse_featurizer_class":
                "IdentityInverseFeaturizerModule", "n_features": None if featurizer is None else featurizer.n_features,
                "additional_config": {}}
        return {"model_info": info, "state_dict": {}}, {"model_info": info, "state_dict": {}}
    if not isinstance(featurizer, Subspace):
        return None
    R = featurizer.basis.detach().float().cpu()
    rotate = torch.nn.utils.parametrizations.orthogonal(_Rotate(R))
    state = {f"rotate.{k}": v.detach().clone() for k, v in rotate.state_dict().items()}
    info = {"featurizer_class": "SubspaceFeaturizerModule", "inverse_featurizer_class":
            "SubspaceInverseFeaturizerModule", "n_features": int(R.shape[1]),
            "additional_config": {"rotation_matrix": rotate.weight.detach().clone(), "requires_grad": False}}
    return {"model_info": info, "state_dict": state}, {"model_info": info, "state_dict": dict(state)}


@dataclass(frozen=True)
class Unit:
    """One model unit of a submission: cprobe's site, its featurizer and the selected features (None: all)."""

    layer: int
    position: str  # MIB's token position id
    featurizer: Featurizer | None
    indices: Sequence[int] | None = None


def export(root: Path, task: str, model_class: str, variable: str, units: Sequence[Unit], n_layers: int) -> Path:
    """Write one ``{task}_{model_class}_{variable}`` folder of a submission under ``root`` (module doc); returns it.
    Units at cprobe's last layer (``n_layers``) are left out (no ``block_input`` unit)."""
    from cprobe.io import atomic_write_bytes, atomic_write_with

    folder = Path(root) / f"{task}_{model_class}_{variable}"
    folder.mkdir(parents=True, exist_ok=True)
    for u in units:
        if u.layer >= n_layers:
            continue
        base = folder / unit_id(u.layer, u.position)
        files = checkpoints(u.featurizer)
        if files is not None:
            for suffix, obj in zip(("_featurizer", "_inverse_featurizer"), files):
                atomic_write_with(Path(f"{base}{suffix}"), lambda f, obj=obj: torch.save(obj, f))
        idx = None if u.indices is None else [int(i) for i in u.indices]
        atomic_write_bytes(Path(f"{base}_indices"), json.dumps(idx).encode())
    return folder


def write_manifest(root: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """``root/cprobe_submission.json``: the folders cprobe wrote there (these ``entries`` replace the ones of the same
    folder already listed)."""
    from cprobe.io import read_json, write_json

    old = (read_json(Path(root) / MANIFEST) or {}).get("folders", [])
    names = {e["folder"] for e in entries}
    write_json(Path(root) / MANIFEST, {
        "format": "MIB causal variable track submission, written by cprobe",
        "unit_layers": "ResidualStream Layer-l = block_input of block l = cprobe layer l",
        "folders": [*(e for e in old if e.get("folder") not in names), *entries]})


# ----------------------------------------------------------------------------------------------- reading
def read_checkpoint(path: Path) -> dict[str, Any]:
    """A featurizer checkpoint read with ``torch.load(weights_only=True)``; a file that needs unpickling anything
    else (or is no checkpoint) is refused in one line."""
    import pickle

    try:
        obj = torch.load(Path(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: not readable with torch.load(weights_only=True) ({first[:160]}); cprobe never "
                        "unpickles a file it did not write") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model_info"), dict) or "state_dict" not in obj:
        raise DataError(f"{path}: no MIB featurizer checkpoint (a dict with model_info and state_dict)")
    return obj


# ----------------------------------------------------------------------------------------------- the verifier
@dataclass
class Verdict:
    """What MIB's ``verify_submission.py`` would print: errors, warnings and the (task, model, variable) triplets
    found; ``ok`` when there are no errors and at least one triplet."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    triplets: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.triplets)

    def text(self) -> str:
        out = ("ERRORS:\n" + "\n".join(self.errors)) if self.errors else "Valid submission."
        if self.warnings:
            out += "\n\n------\n\nWARNINGS:\n" + "\n".join(self.warnings)
        if not self.errors and not self.warnings:
            out = f"Perfect submission! No errors or warnings. Found {len(self.triplets)} valid triplet(s)."
        return out


def _triplet_dir(path: Path) -> tuple[bool, str]:
    """MIB's ``verify_directory``: a unit with indices (a JSON list or null) and, if any, a featurizer and its inverse
    whose ``model_info`` names known module classes (read with weights_only=True)."""
    for name in sorted(p.name for p in path.iterdir()):
        prefix = path / "_".join(name.split("_")[:-1])
        try:
            idx_ok = Path(f"{prefix}_indices").is_file() and _indices_line(Path(f"{prefix}_indices"))
        except (ValueError, SyntaxError):
            idx_ok = False
        feat = inv = False
        if Path(f"{prefix}_featurizer").is_file():
            feat = read_checkpoint(Path(f"{prefix}_featurizer"))["model_info"].get("featurizer_class") in MODULES
        if Path(f"{prefix}_inverse_featurizer").is_file():
            info = read_checkpoint(Path(f"{prefix}_inverse_featurizer"))["model_info"]
            inv = info.get("inverse_featurizer_class") in MODULES
        if idx_ok and feat and inv:
            return True, "Found valid featurizer modules and indices!"
        if idx_ok and not feat and not inv:
            return True, "Found valid indices but no featurizer modules!"
    return False, "No valid featurizer/inverse featurizer/indices triplet files."


def _indices_line(path: Path) -> bool:
    lines = path.read_text().splitlines()
    s = lines[0] if lines else ""
    return s == "null" or isinstance(ast.literal_eval(s), list)


def _parse_name(name: str, models: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    parts = name.split("_")
    task = next((t for t in TASKS if parts[: len(t.split("_"))] == t.split("_")), None)
    if task is None:
        return None, None, None
    rest = parts[len(task.split("_")):]
    model, end = None, 0
    for m in models:
        mp = m.split("_")
        hit = next((i for i in range(len(rest) - len(mp) + 1) if rest[i: i + len(mp)] == mp), None)
        if hit is not None:
            model, end = m, hit + len(mp)
            break
    if model is None:
        return task, None, None
    var = next((v for v in TASKS[task] if rest[end:] == v.split("_")), None)
    return task, model, var


def verify(root: Path, extra_models: Sequence[str] = ()) -> Verdict:
    """MIB's verifier logic (``verify_submission.py``) on a submission folder, reading checkpoints only with
    ``weights_only=True``. ``extra_models``: architecture classes accepted beside MIB's four (for every task), for a
    model MIB's leaderboard does not list; MIB's own verdict is ``extra_models=()``. Python files in the folder are
    parsed, never run: ``get_token_positions`` must return a list of ``TokenPosition`` calls (MIB's static check)."""
    root = Path(root)
    v = Verdict()
    models = (*MODELS, *extra_models)
    valid = VALID | {(t, m) for t in TASKS for m in extra_models}
    py = sorted(p for p in root.iterdir() if p.suffix == ".py")
    if py and not any(_token_positions_ok(p) for p in py):
        v.errors.append("Token position function verification failed: no get_token_positions returning a list of "
                        "TokenPosition objects")
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        task, model, var = _parse_name(d.name, models)
        why = ("Could not identify valid task name" if task is None else "Could not identify valid model name"
               if model is None else f"Could not identify valid variable name for task {task}" if var is None
               else f"Task {task} and model {model} not in valid combinations" if (task, model) not in valid else "")
        if why:
            v.warnings.append(f"Skipped directory `{d.name}`: {why}")
            continue
        found, message = _triplet_dir(d)
        if not found:
            for sub in sorted(p for p in d.iterdir() if p.is_dir()):
                found, message = _triplet_dir(sub)
                if found:
                    break
        if found:
            v.triplets.add((task, model, var))
        else:
            v.warnings.append(f"Couldn't find a valid featurizer/inverse featurizer/indices triplet in {d.name}: "
                              f"{message}")
    return v


def _token_positions_ok(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, ValueError):
        return False
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_token_positions"), None)
    if fn is None:
        return False

    def listed(node: Any) -> bool:
        return isinstance(node, ast.List) and any(isinstance(e, ast.Call) and isinstance(e.func, ast.Name)
                                                  and e.func.id == "TokenPosition" for e in node.elts)
    for r in (n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None):
        if isinstance(r.value, ast.Name):
            return any(listed(a.value) for a in ast.walk(fn) if isinstance(a, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id == r.value.id for t in a.targets))
        return listed(r.value)
    return False


# ----------------------------------------------------------------------------------------------- MIB's results
def aggregates(iia: np.ndarray, layers: Sequence[int]) -> tuple[float, float, int, int]:
    """(best over layers, mean over layers, the best layer's index, that layer's best site) of the per-site IIA
    ``iia`` (S,) over sites whose layers are ``layers`` (S,): per layer the best position first (MIB)."""
    layers = np.asarray(layers)
    per_layer, where = [], []
    for l in dict.fromkeys(layers.tolist()):
        idx = np.flatnonzero(layers == l)
        j = idx[int(np.argmax(iia[idx]))]
        per_layer.append(iia[j])
        where.append(j)
    best = int(np.argmax(per_layer))
    return float(np.max(per_layer)), float(np.mean(per_layer)), best, int(where[best])


METHOD_NAMES = {"full_vector": "vanilla", "DAS": "das", "DBM": "dbm"}
"""MIB's baseline names that are cprobe's methods (DBM over the standard basis is cprobe's default ``dbm``); any other
name (``DBM+PCA``, a submission's) is kept as it is."""


def _unit_scores(data: Mapping[str, Any], variable: str, private: bool) -> dict[str, tuple[int | None, list]]:
    """Per model unit: its layer and the average_score of each (public or private) counterfactual dataset."""
    units: dict[str, tuple[int | None, list]] = {}
    for name, ds in (data.get("dataset") or {}).items():
        if ("private" in name) != private:
            continue
        for uid, u in (ds.get("model_unit") or {}).items():
            meta = u.get("metadata") or {}
            layer = meta.get("layer")
            if layer is None:
                hit = re.search(r"Layer[:\-_*](\d+)", uid)
                layer = int(hit.group(1)) if hit else None
            units.setdefault(uid, (layer, []))[1].append(float((u.get(variable) or {}).get("average_score", 0)))
    return units


def results_rows(data: Mapping[str, Any], private: bool = False) -> list[dict[str, Any]]:
    """The MIB study's summary rows of one of MIB's per-run result JSONs (``aggregate_results.py``'s input: per
    counterfactual dataset and model unit, a variable's ``average_score``), aggregated as ``analyze_json`` does."""
    variables = sorted({k for ds in (data.get("dataset") or {}).values() for u in (ds.get("model_unit") or {}).values()
                        for k, v in u.items() if k != "metadata" and isinstance(v, dict)
                        and ("average_score" in v or "scores" in v)})
    rows = []
    for var in variables[:1]:  # MIB scores the first target variable it finds
        units = _unit_scores(data, var, private)
        scored = [(layer, sum(s) / len(s)) for layer, s in units.values() if layer is not None and s]
        if not scored:
            continue
        best, mean, _, _ = aggregates(np.array([s for _, s in scored]), [l for l, _ in scored])
        rows += _rows(str(data.get("method_name", "unknown")), str(data.get("model_name", "unknown")),
                      str(data.get("task_name", "unknown")), var, best, mean)
    return rows


def _rows(method: str, model: str, task: str, variable: str, best: float, mean: float) -> list[dict[str, Any]]:
    from cprobe.data.mib import SPECS

    key = next((k for k, spec in SPECS.items() if spec[0] == task or task.startswith(spec[0])), task)
    common = {"kind": "summary", "dataset": key, "mib_task": task, "variable": variable,
              "method": METHOD_NAMES.get(method, method), "family": "direction", "control": "none",
              "counterfactual": "all", "model": model, "layer": -1, "position": "", "n": None,
              "method_source": f"MIB results ({method})"}
    return [{**common, "metric": "mib_best", "value": best}, {**common, "metric": "mib_mean", "value": mean}]


def aggregated_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The MIB study's summary rows of ``aggregate_results.py``'s output: ``str((method, model, task, variables))``
    -> ``{average_accuracy, highest_accuracy, …}``."""
    rows = []
    for key, v in data.items():
        try:
            method, model, task, variables = ast.literal_eval(key) if key.startswith("(") else (
                v["method_name"], v["model_name"], v["task_name"], v["target_variables"])
        except (ValueError, SyntaxError, KeyError):
            raise DataError(f"MIB aggregated results: key {key[:60]!r} is no (method, model, task, variables)"
                            ) from None
        rows += _rows(str(method), str(model), str(task), str(variables), float(v["highest_accuracy"]),
                      float(v["average_accuracy"]))
    return rows


def results_table(path: Path) -> Any:
    """The MIB study's table of one of MIB's result files (a per-run JSON or ``aggregated_results.json``); None for
    a JSON file of another kind."""
    import pandas as pd

    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and "dataset" in data and "method_name" in data:
        rows = results_rows(data)
    elif isinstance(data, dict) and data and all(isinstance(v, dict) and {"average_accuracy", "highest_accuracy"}
                                                 <= set(v) for v in data.values()):
        rows = aggregated_rows(data)
    else:
        return None
    return pd.DataFrame(rows) if rows else None


def find_results(directory: Path, skip: Sequence[Path] = (), max_bytes: int = 64 << 20) -> list[tuple[Path, Any]]:
    """(file, the MIB study's table) of every MIB result JSON below ``directory`` outside the job dirs ``skip``."""
    out = []
    jobs = [Path(j).resolve() for j in skip]
    for path in sorted(Path(directory).rglob("*.json")):
        r = path.resolve()
        if any(j == r.parent or j in r.parents for j in jobs) or path.stat().st_size > max_bytes:
            continue
        table = results_table(path)
        if table is not None:
            out.append((path, table))
    return out
