"""CausalGym (Arora et al. 2024): 1-D distributed interchange interventions along directions found
by DAS / probe / mean-difference / LDA / PCA / k-means / random (and the vanilla whole-vector swap),
scored by the log odds-ratio at every (layer, region) site, with dog/give control-task selectivity; the interventions
of :mod:`cprobe.interventions` run as methods too (counterfactual ones with z′ = the source's class, erasers also scored
by their erasure, a rank-1 one's direction as a DII: docs/causalgym.md), and ``read_layers`` lets the oracles of every
later layer read the edited pass.

``validate`` checks the settings, the templates file, the tasks, regions and ``template_index`` before any model
loads; ``run`` returns the long table (one row per CausalGym task × condition × method × layer × region), computing
each task with :func:`cprobe.tasks.causalgym_engine.run_gym_task` and writing its rows and directions as it finishes
(``causalgym_tasks/``), so a re-run resumes from the finished tasks; ``report`` writes the per-task overall table,
the method × model summary (like the paper's Table 1), layer × region heat-maps per method and odds-by-layer curves.
The settings schema (:class:`Config`) lives with the engine and is re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cprobe.data.causalgym import TaskTemplate, load_templates
from cprobe.directions import DIRECTIONS
from cprobe.methods import declares, is_intervention, provenance, registry
from cprobe.errors import ConfigError, DataError
from cprobe.io import atomic_write_bytes, parquet_bytes, read_json
from cprobe.job import JobContext, config_hash
from cprobe.metrics.odds import control_selectivity, overall_odds
from cprobe.probes.grid import PROBE_FITS
import cprobe.plots as plots
from cprobe.paths import safe_name
from cprobe.plots import new_figure, save
from cprobe.results import write_table
from cprobe.tasks import Uses
from cprobe.tasks.causalgym_engine import run_gym_task
from cprobe.tasks.causalgym_settings import (CAPABLE_ACCURACY, DEFAULT_ORACLE, METHODS, PAPER_DAS, PAPER_PROBE_LAM,
                                             PAPER_PROBE_LAMS, REFERENCE_PICK, Config, DASKeys, ModelDefaults,
                                             method_runs, resolve_regions)
from cprobe.records import Derived, RecordSpec, const
from cprobe.sae.method import check_sites
from cprobe.sae.quality import HELD_OUT

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "layers"), methods="causalgym.methods")
"""The model and the top-level ``layers``; the pairs come from the templates under ``causalgym:``, the oracle probe
from ``causalgym.oracle_probe`` (not the ``probe`` group), no dataset, split, intervention or position."""

__all__ = ["CAPABLE_ACCURACY", "DEFAULT_ORACLE", "METHODS", "PAPER_DAS", "PAPER_PROBE_LAM", "PAPER_PROBE_LAMS",
           "REFERENCE_PICK", "USES", "Config", "DASKeys", "ModelDefaults", "load_directions", "report", "run",
           "save_directions", "task_templates", "validate"]

DECODABLE_ACCURACY = 0.9
"""Sites whose oracle probe reaches this eval accuracy count for the overall completeness."""

PARTS = "causalgym_tasks"
"""The job dir's folder of per-task results, written as each task finishes; a re-run resumes from them."""


def task_templates(config: Config, data_root: Path) -> dict[str, TaskTemplate]:
    """The configured tasks' templates (every task of the file when ``tasks`` is null), with each task's regions
    checked: a bad templates file, task name, ``template_index`` or region is a one-line error."""
    path = Path(config.templates)
    templates = load_templates(path if path.is_absolute() else Path(data_root) / path, config.template_index,
                               config.tasks)
    for template in templates.values():
        resolve_regions(config.regions, template)
    return templates


def validate(job: Any) -> None:
    """Everything a run would find wrong, before any model loads: the per-model settings (λ, DAS budget), the oracle
    probe's config, and (with a data dir) the templates file, the tasks, ``template_index`` and the regions."""
    from cprobe.probes import PROBES

    config: Config = job.task_cfg
    config.resolve(job.cfg.get("model") or {})
    for m in filter(is_intervention, config.methods):  # an SAE's folder: at each layer named, before any model loads
        check_sites(registry(m).get(m), config.intervention_params(m), job.keys.layers,
                    (job.keys.model or {}).get("name"))
    if config.reliability:
        PROBES.build(config.oracle_probe, seed=0)
    if any(declares(m, "needs_probe") for m in config.methods):
        try:
            PROBES.build(config.interventional_probe or config.oracle_probe, seed=0)
        except ConfigError as e:
            raise ConfigError(f"causalgym.interventional_probe: {e}") from None
    data_root = getattr(job, "data_root", None)
    if data_root is not None:
        try:
            task_templates(config, data_root)
        except DataError as e:
            raise ConfigError(f"causalgym: {e}") from None


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    cfg = ctx.cfg
    config = config.resolve(cfg["model"])
    templates = task_templates(config, ctx.data_root)
    names = list(templates)
    parts = TaskParts(ctx.out_dir / PARTS, _parts_key(cfg), fresh=bool(cfg.get("force", False)))
    frames: list[pd.DataFrame] = []
    directions: dict[str, torch.Tensor] = {}
    done = [n for n in names if parts.has(n)]
    if done:
        log.info("causalgym: resuming; %d of %d task(s) already done in %s (%s)", len(done), len(names),
                 parts.directory, ", ".join(done))
    for name in names:

        def compute(name: str = name) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
            adapter = ctx.adapter(cfg["model"])  # device=cuda puts the model (and every intervention) on the GPU
            t0 = time.perf_counter()
            found: dict[str, torch.Tensor] = {}
            rows = run_gym_task(adapter, templates[name], config, layers=cfg.get("layers", "blocks"), seed=ctx.seed,
                                device=ctx.device, progress=ctx.progress, timings=ctx.timings, directions=found,
                                probe_cache=ctx.cache_dir(PROBE_FITS))
            frame = pd.DataFrame(rows)
            frame.insert(0, "model", adapter.name)
            frame["device"] = str(adapter.device)
            log.info("causalgym %s done in %.1fs", name, time.perf_counter() - t0)
            return frame, found

        frame, found = parts.get(name, compute)
        frames.append(frame)
        directions.update(found)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(table):
        sources = method_sources(config)
        table["method_source"] = [sources.get(m, "") for m in table["method"]]
    model = str(table["model"].iloc[0]) if len(table) else str(cfg["model"].get("name"))
    save_directions(directions, ctx.out_dir / DIRECTIONS_FILE, model=model, stream=config.stream)
    incapable = sorted(table.loc[~table["capable"].astype(bool), "cg_task"].unique()) if len(table) else []
    if incapable:
        ctx.warn(f"{len(incapable)} of {len(names)} tasks are beyond {model} (accuracy < {CAPABLE_ACCURACY} "
                 f"or unknown label tokens): {', '.join(incapable)}; they are marked capable=false and the "
                 "summary also reports the capable tasks alone")
    return table


def method_sources(config: Config) -> dict[str, str]:
    """Row label -> where its method came from (built-in, a plugin's package and version, an import path): each
    run's label (``probe0``), and ``<label>_dir`` for an intervention's direction."""

    out = {}
    for run in method_runs(config):
        out[run.label] = provenance(run.name)
        if run.intervention:
            out[f"{run.label}_dir"] = out[run.label]
    return out


def _parts_key(cfg: dict[str, Any]) -> str:
    """What a task's results depend on: the job config but the run switches and the list of tasks (a re-run with
    more tasks reuses the finished ones)."""
    node = {**(cfg.get("causalgym") or {}), "tasks": None}
    return config_hash({**{k: v for k, v in cfg.items() if k not in ("force", "progress", "cache")}, "causalgym": node})


@dataclass
class TaskParts:
    """Per-task results in the job dir: one checked entry per task (:func:`cprobe.cache.checked_entry`: its long-table
    rows ``table.parquet`` and its directions ``directions.safetensors``, checksummed, renamed into place whole as the
    task finishes), and ``manifest.json``, the index of finished tasks under the config key (written after each).

    Every task's table goes through the same Parquet bytes whether it was just computed or read back, so a resumed
    run's tables are byte-identical to an uninterrupted one's. Parts made under another config key (or an older
    format), or failing their checksum, are recomputed."""

    directory: Path
    key: str
    fresh: bool = False

    PARTS_MANIFEST = "manifest.json"
    VERSION = 2  # 2: one checked entry per task; 1: loose files with SHA-256 sums in the manifest

    def __post_init__(self) -> None:
        self.manifest: dict[str, Any] = {"key": self.key, "version": self.VERSION, "tasks": {}}
        old = None if self.fresh else read_json(self.directory / self.PARTS_MANIFEST)
        if old is None:
            return
        if old.get("key") == self.key and old.get("version") == self.VERSION:
            self.manifest = old
        else:
            log.info("causalgym: %s holds results of another config; recomputing every task", self.directory)

    def has(self, name: str) -> bool:
        return name in self.manifest["tasks"]

    def get(self, name: str, compute: Callable[[], tuple[pd.DataFrame, dict[str, torch.Tensor]]]
            ) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
        """Task ``name``'s (table, directions): read back when it finished under this key, else ``compute()``d
        and saved."""
        from safetensors.torch import load, save

        from cprobe.cache import checked_entry

        def build(_: Path) -> dict[str, bytes]:
            frame, directions = compute()
            return {"table.parquet": parquet_bytes(frame),
                    "directions.safetensors": save({k: v.contiguous() for k, v in directions.items()})}

        stem = f"{safe_name(name, limit=80)}.{hashlib.sha256(name.encode()).hexdigest()[:8]}"  # distinct names
        entry, hit = checked_entry(self.directory / stem, build, f"the CausalGym task {name}",
                                   rebuild=not self.has(name))
        if not hit:
            self.manifest["tasks"][name] = entry.name
            atomic_write_bytes(self.directory / self.PARTS_MANIFEST, json.dumps(self.manifest, indent=1).encode())
        return pd.read_parquet(entry / "table.parquet"), load((entry / "directions.safetensors").read_bytes())


DIRECTIONS_FILE = "directions.safetensors"


def save_directions(directions: dict[str, torch.Tensor], path: Path, **meta: str) -> None:
    """Every learned unit direction (float32), keyed ``<task>/<condition>/<method>/L<layer>/R<region>``, as
    safetensors (no pickle), written atomically, the same bytes for the same directions; ``meta`` (model, stream) is
    the JSON of the file's one metadata entry ``cprobe``. Load with :func:`load_directions`."""
    from safetensors.torch import save

    if not directions:
        return
    # one metadata entry: safetensors keeps metadata in a hash map, so several keys come out in a random order
    info = json.dumps({k: str(v) for k, v in meta.items()}, sort_keys=True)
    blob = save({k: v.contiguous() for k, v in directions.items()}, metadata={"cprobe": info})
    atomic_write_bytes(Path(path), blob)


def load_directions(path: Path) -> dict[str, torch.Tensor]:
    """The directions a CausalGym job saved (see :func:`save_directions`)."""
    from safetensors.torch import load_file

    return load_file(str(path))


# ---------------------------------------------------------------------------------- aggregation


def _grid(part: pd.DataFrame) -> np.ndarray:
    """(layers × regions) AvgOdds table of one task/method/condition (NaN where not a site)."""
    return part.pivot_table(index="layer", columns="region_idx", values="odds", aggfunc="mean").to_numpy()


def overall_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model × task × method (× seed): overall odds, selectivity, accuracies and capability (what was measured:
    the seconds each took are in the job's ``timings.csv`` / ``status.json``, so a seed gives the same table)."""
    keys = [k for k in ("model", "cg_task", "method", "seed") if k in table]
    out = []
    for key, part in table.groupby(keys, sort=True):
        rec = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        task = part[part["condition"] == "task"]
        if task.empty:
            continue
        rec["edit"] = str(task["edit"].iloc[0]) if "edit" in task else "dii"
        control = part[part["condition"] == "control"]
        # odds for every method; for an eraser also its erasure (how far it moved the log-odds toward 0), aggregated
        # the same way (eq. 19) and with the same control-task selectivity
        for col, prefix in (("odds", ""), ("erasure", "erasure_"), ("erased_fraction", "erased_fraction_")):
            if col not in task or (col != "odds" and task[col].isna().all()):
                continue
            tgrid = task.pivot_table(index="layer", columns="region_idx", values=col, aggfunc="mean", dropna=False)
            rec[f"overall_{col}"] = _overall(tgrid.to_numpy())
            if col == "erased_fraction":
                continue
            cgrid = None if control.empty else control.pivot_table(
                index="layer", columns="region_idx", values=col, aggfunc="mean", dropna=False).reindex_like(tgrid)
            rec[f"{prefix}selectivity"] = np.nan if cgrid is None else _overall(tgrid.to_numpy(), cgrid.to_numpy())
            rec[f"control_overall_{col}"] = np.nan if cgrid is None else _overall(cgrid.to_numpy())
        rec.update(_reliability(task))
        rec["max_iia"] = float(task["iia"].max())
        rec["task_accuracy"] = float(task["task_accuracy"].iloc[0])
        rec["capable"] = bool(capable_flag(task).iloc[0])
        rec["unknown_labels"] = str(task["unknown_labels"].iloc[0]) if "unknown_labels" in task else ""
        rec["probe_lam"] = float(task["probe_lam"].iloc[0]) if "probe_lam" in task else np.nan
        rec["stream"] = str(task["stream"].iloc[0]) if "stream" in task else "resid"
        rec["probe_accuracy"] = float(task["probe_accuracy"].mean()) if task["probe_accuracy"].notna().any() else np.nan
        rec["n_sites"] = len(task)
        out.append(rec)
    return pd.DataFrame(out)


def _overall(grid: np.ndarray, control: np.ndarray | None = None) -> float:
    """Eq. 19 (mean over layers of the max over regions; with ``control``, of the per-site task − control), NaN
    where a layer has no scored site (a ``<name>_dir`` run whose intervention edited more than one direction)."""
    try:
        return overall_odds(grid) if control is None else control_selectivity(grid, control)
    except ValueError:
        return float("nan")


def _reliability(task: pd.DataFrame) -> dict[str, float]:
    """Beyond the paper: mean counterfactual completeness over the sites where the oracle decodes the
    property (eval accuracy >= DECODABLE_ACCURACY); a site-average, as the reliability study averages
    over test embeddings. Oracle selectivity is NaN (no non-targeted property in the templates)."""
    if "completeness" not in task or task["completeness"].isna().all():
        return {"completeness": np.nan, "oracle_selectivity": np.nan, "n_decodable_sites": 0}
    ok = task[task["oracle_accuracy"] >= DECODABLE_ACCURACY]
    return {"completeness": float(ok["completeness"].mean()) if len(ok) else np.nan,
            "oracle_selectivity": float(ok["oracle_selectivity"].mean()) if len(ok) else np.nan,
            "n_decodable_sites": int(len(ok))}


def capable_flag(part: pd.DataFrame) -> pd.Series:
    """Per row: a task the model can do (tables written before the ``capable`` column: accuracy alone)."""
    return part["capable"].astype(bool) if "capable" in part else part["task_accuracy"] >= CAPABLE_ACCURACY


def summary_table(overall: pd.DataFrame) -> pd.DataFrame:
    """Method × model means over tasks (the paper's Table 1), plus the same over the capable tasks.

    Where a model ran two probes (``probe0``/``probe1``, the paper's Probe⁰/Probe¹), a ``probe`` row
    repeats the better of the two by overall odds over all tasks (Table 1's "better of two probes");
    ``probe_pick`` names it (``capable_probe_pick``: the better one over the capable tasks, whose means the
    row's ``capable_*`` columns hold).
    """
    if overall.empty:
        return overall
    rows = []
    for (model, method), part in overall.groupby(["model", "method"], sort=True):
        capable = part[capable_flag(part)]
        rows.append({
            "model": model, "method": method, "edit": str(part["edit"].iloc[0]) if "edit" in part else "dii",
            "n_tasks": part["cg_task"].nunique(),
            "overall_odds": part["overall_odds"].mean(), "selectivity": part["selectivity"].mean(),
            "n_capable_tasks": capable["cg_task"].nunique(),
            "capable_overall_odds": capable["overall_odds"].mean() if len(capable) else np.nan,
            "capable_selectivity": capable["selectivity"].mean() if len(capable) else np.nan,
            "completeness": part["completeness"].mean() if "completeness" in part else np.nan,
            "oracle_selectivity": part["oracle_selectivity"].mean() if "oracle_selectivity" in part else np.nan,
            **{c: part[c].mean() if c in part else np.nan
               for c in ("overall_erasure", "erasure_selectivity", "overall_erased_fraction")},
            **({"capable_overall_erasure": capable["overall_erasure"].mean() if len(capable) else np.nan}
               if "overall_erasure" in part else {}),
            "probe_pick": "", "capable_probe_pick": "",
        })
    out = pd.DataFrame(rows)
    picks = []
    for (model, base), probes in out.assign(base=out["method"].map(_per_lambda_base)).groupby(["model", "base"],
                                                                                               sort=True):
        if base and len(probes) >= 2:
            best = probes.sort_values(["overall_odds", "method"], ascending=[False, True]).iloc[0].copy()
            best["probe_pick"] = str(best["method"])
            best["method"] = base
            # over the capable tasks alone, the better of the two there (it may be the other one)
            cap = probes.sort_values(["capable_overall_odds", "method"], ascending=[False, True],
                                     na_position="last").iloc[0]
            for col in ("n_capable_tasks", "capable_overall_odds", "capable_selectivity"):
                best[col] = cap[col]
            best["capable_probe_pick"] = str(cap["method"])
            picks.append(best.drop("base"))
    if picks:
        out = pd.concat([out, pd.DataFrame(picks)], ignore_index=True)
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    return out.sort_values(["model", "method"], key=lambda c: c.map(order).fillna(99) if c.name == "method" else c,
                           kind="stable").reset_index(drop=True)


def _per_lambda_base(label: str) -> str:
    """``probe`` for ``probe0``/``probe1``...: the method whose runs differ by λ (the ``per_model_lambda``
    capability), else ""."""
    m = re.fullmatch(r"(.+?)(\d+)", str(label))
    return m.group(1) if m and m.group(1) in DIRECTIONS and DIRECTIONS.get(m.group(1)).per_model_lambda else ""


METHOD_ORDER = ("das", "probe", "probe0", "probe1", "mean", "pca", "kmeans", "lda", "random", "vanilla")
"""Row order of the paper's tables (Table 1: DAS, Probe, Mean, PCA, k-means, LDA, Random, Vanilla)."""


def table1(summary: pd.DataFrame, capable_only: bool = False) -> pd.DataFrame:
    """The paper's Table 1 layout: one row per method, per model an odds and a selectivity column
    (``<model> odds``, ``<model> sel``); ``capable_only`` averages the capable tasks alone."""
    if summary.empty:
        return summary
    odds, sel = ("capable_overall_odds", "capable_selectivity") if capable_only else ("overall_odds", "selectivity")
    models = sorted(summary["model"].unique())
    methods = [m for m in METHOD_ORDER if m in set(summary["method"])]
    methods += sorted(set(summary["method"]) - set(methods))
    rows = []
    for method in methods:
        rec: dict[str, Any] = {"method": method}
        for model in models:
            hit = summary[(summary["model"] == model) & (summary["method"] == method)]
            rec[f"{model} odds"] = float(hit[odds].iloc[0]) if len(hit) else np.nan
            rec[f"{model} sel"] = float(hit[sel].iloc[0]) if len(hit) else np.nan
        rows.append(rec)
    tasks = summary.groupby("model")["n_capable_tasks" if capable_only else "n_tasks"].max()
    rows.append({"method": "(tasks averaged)", **{f"{m} odds": float(tasks[m]) for m in models},
                 **{f"{m} sel": float(tasks[m]) for m in models}})
    return pd.DataFrame(rows)


def report(table: pd.DataFrame, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    overall = overall_table(table)
    write_table(overall, out_dir / "causalgym_overall")
    summary = summary_table(overall)
    write_table(summary, out_dir / "causalgym_summary")
    write_table(table1(summary), out_dir / "causalgym_table1")
    write_table(table1(summary, capable_only=True), out_dir / "causalgym_table1_capable")
    for (model, name), part in table.groupby(["model", "cg_task"], sort=True):
        acc = float(part["task_accuracy"].iloc[0])
        cap = "" if capable_flag(part).iloc[0] else " — NOT capable"
        _heatmaps(part, out_dir / f"heatmap_{safe_name(model)}_{safe_name(name)}.png",
                  f"{model} · {name} (accuracy {acc:.2f}{cap})")
    for model, part in table[table["condition"] == "task"].groupby("model", sort=True):
        _odds_by_layer(part, out_dir / f"odds_by_layer_{safe_name(model)}.png", str(model))
    reads = read_layers_table(table)
    if not reads.empty:
        write_table(reads, out_dir / "causalgym_read_layers")
        for model, part in reads.groupby("model", sort=True):
            _read_heatmaps(part, out_dir / f"read_layers_{safe_name(model)}.png", str(model))


READ_PREFIX = "completeness_l"
"""Long-table columns of ``causalgym.read_layers``: ``completeness_l<l'>``, the oracle at layer l' (same region,
trained on clean states) reading the forward pass edited at the row's layer (NaN for l' < layer)."""


def read_layers_table(table: pd.DataFrame) -> pd.DataFrame:
    """The downstream reads as a long table: per model × task × method × edited layer l × read layer l' ≥ l, the
    mean completeness over the regions where the oracle at (l', region) decodes the property (eval accuracy ≥
    DECODABLE_ACCURACY), and how many regions that is. Empty when the run had ``read_layers`` off."""
    cols = sorted((c for c in table.columns if c.startswith(READ_PREFIX)), key=lambda c: int(c[len(READ_PREFIX):]))
    if not cols or table.empty:
        return pd.DataFrame()
    task = table[table["condition"] == "task"]
    decodes = {(m, t, int(lr), int(rg)): float(a) for m, t, lr, rg, a in
               task[["model", "cg_task", "layer", "region_idx", "oracle_accuracy"]].drop_duplicates(
                   ["model", "cg_task", "layer", "region_idx"]).itertuples(index=False)}
    out = []
    for (model, name, method, layer), part in task.groupby(["model", "cg_task", "method", "layer"], sort=True):
        for col in cols:
            read = int(col[len(READ_PREFIX):])
            if read < layer:
                continue
            ok = part[[decodes.get((model, name, read, int(r)), 0.0) >= DECODABLE_ACCURACY
                       for r in part["region_idx"]]]
            vals = ok[col].dropna()
            out.append({"model": model, "cg_task": name, "method": method, "layer": int(layer), "read_layer": read,
                        "completeness": float(vals.mean()) if len(vals) else np.nan, "n_regions": int(len(vals)),
                        "n_eval": int(part["n_eval"].max()),
                        **({"seed": part["seed"].iloc[0]} if "seed" in part else {})})
    return pd.DataFrame(out)


def _read_heatmaps(reads: pd.DataFrame, path: Path, title: str) -> None:
    """Per method, the edited layer l × read layer l' completeness (mean over tasks), one colour scale [0, 1]."""
    methods = [m for m in METHOD_ORDER if m in set(reads["method"])] + sorted(set(reads["method"]) - set(METHOD_ORDER))
    layers = sorted(set(reads["layer"]) | set(reads["read_layer"]))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_cols = min(4, len(methods))
    n_rows = -(-len(methods) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.0 * n_cols + 1.2, 2.8 * n_rows + 1.0), squeeze=False,
                             layout="constrained")
    im = None
    for ax in axes.ravel()[len(methods):]:
        ax.axis("off")
    for ax, method in zip(axes.ravel(), methods):
        grid = reads[reads["method"] == method].pivot_table(index="layer", columns="read_layer",
                                                            values="completeness", aggfunc="mean")
        grid = grid.reindex(index=layers, columns=layers)
        im = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=1, origin="lower", aspect="auto")
        ax.set_xticks(range(len(layers)), [str(x) for x in layers], fontsize=9)
        ax.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=9)
        ax.set_xlabel("read layer l′", fontsize=9)
        ax.set_ylabel("edited layer l", fontsize=9)
        ax.set_title(method, fontsize=10)
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
        cb.set_label("oracle completeness (decodable regions, mean over tasks)", fontsize=9)
    _caption(fig, "CausalGym read layers: the oracle at l′ (trained on clean states) reading the pass edited at l",
             reads, note=f"{title}; cprobe layers; mean over tasks of the regions whose oracle at l′ decodes")
    save(fig, path)


def _layer_labels(part: pd.DataFrame, layers: list[int]) -> tuple[list[str], str]:
    """Tick labels as the paper's (blocks 0..L−1; ``emb`` for the embeddings) and the axis label."""
    stream = str(part["stream"].iloc[0]) if "stream" in part else "resid"
    labels = ["emb" if l == 0 else str(l - 1) for l in layers]
    return labels, "layer (as the paper: block 0…L−1" + (", last = block output)" if stream == "block"
                                                         else ", last = after final norm)")


def _heatmaps(part: pd.DataFrame, path: Path, title: str) -> None:
    """Layer × region AvgOdds per method (columns) for the task, the control task and their difference
    (selectivity) (rows), on one symmetric colour scale whose range the colour bar states."""
    methods = [m for m in METHOD_ORDER if m in set(part["method"])] + sorted(set(part["method"]) - set(METHOD_ORDER))
    layers = sorted(part["layer"].unique())
    all_regions = sorted(part["region_idx"].unique())

    def grid(condition: str, method: str) -> pd.DataFrame:  # every panel: the same rows and columns
        rows = part[(part["condition"] == condition) & (part["method"] == method)]
        return rows.pivot_table(index="layer", columns="region_idx", values="odds", aggfunc="mean").reindex(
            index=layers, columns=all_regions)

    control = part[part["condition"] == "control"]
    grids: dict[tuple[str, str], pd.DataFrame] = {("task", m): grid("task", m) for m in methods}
    if not control.empty:
        for m in methods:
            grids["control", m] = grid("control", m)
            grids["selectivity", m] = grids["task", m] - grids["control", m]
    n_rows = 1 if control.empty else 3
    regions = part.drop_duplicates("region_idx").set_index("region_idx")["region"]
    cell_w, cell_h = max(2.4, 0.45 * len(all_regions) + 1.2), max(2.0, 0.32 * len(layers) + 1.4)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(n_rows, len(methods), figsize=(cell_w * len(methods) + 1.2, cell_h * n_rows + 1.2),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    values = np.concatenate([g.to_numpy(dtype=float).ravel() for g in grids.values()]) if grids else np.zeros(1)
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    vmax = max(abs(lo), abs(hi)) or 1.0
    ylabels, ylabel = _layer_labels(part, layers)
    order = ["task", "control", "selectivity"]
    im = None
    for (kind, method), g in grids.items():
        row, col = order.index(kind), methods.index(method)
        ax = axes[row, col]
        im = ax.imshow(g.to_numpy(dtype=float), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", origin="lower")
        ax.set_xticks(range(len(all_regions)), [str(regions.loc[c]) for c in all_regions], rotation=60,
                      ha="right", fontsize=9)
        ax.set_yticks(range(len(layers)), ylabels, fontsize=9)
        ax.set_title(f"{method} · {kind}", fontsize=10)
        if col == 0:
            ax.set_ylabel("layer", fontsize=9)
        if row == n_rows - 1:
            ax.set_xlabel("region", fontsize=9)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
    cb.set_label(f"AvgOdds (log odds ratio); scale ±{vmax:.2f}, data {lo:.2f} … {hi:.2f}", fontsize=9)
    cb.ax.tick_params(labelsize=9)
    _caption(fig, "CausalGym AvgOdds by layer × region (rows: task, control, selectivity)", part,
             note=f"{title}; {ylabel}")
    save(fig, path)


def _odds_by_layer(part: pd.DataFrame, path: Path, title: str) -> None:
    """Max-over-regions AvgOdds per layer, averaged over tasks, one line per method (paper Fig. 7)."""
    fig, axes = new_figure(1, width=6.0, height=4.0)
    ax = axes[0]
    per = part.groupby(["cg_task", "method", "layer"])["odds"].max().groupby(["method", "layer"]).mean()
    present = per.index.get_level_values(0)
    for method in [m for m in METHOD_ORDER if m in present] + sorted(set(present) - set(METHOD_ORDER)):
        s = per.loc[method]
        ax.plot(s.index, s.values, marker="o", label=method)
    layers = sorted(part["layer"].unique())
    labels, xlabel = _layer_labels(part, layers)
    ax.set_xticks(layers, labels, fontsize=9)
    ax.tick_params(axis="y", labelsize=9)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("max-over-regions AvgOdds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    _caption(fig, "CausalGym: max-over-regions AvgOdds by layer, averaged over tasks", part)
    save(fig, path)


def _caption(fig: Any, shows: str, part: pd.DataFrame, note: str = "") -> None:
    """What every CausalGym figure names: the task(s) (the property the pairs differ in), the model, the templates,
    n (evaluation pairs per site) and the seed."""
    data = part["templates"] if "templates" in part else "CausalGym templates"
    n = plots.counts(plots.values(part["n_eval"]), "eval pairs per site") if "n_eval" in part else ""
    plots.caption(fig, shows, property=part["cg_task"], model=part["model"], data=data, n=n, seed=part.get("seed"),
                  note=note)


# ----------------------------------------------------------------------------------------------- records
_OVERALL = {"overall_odds": "overall_odds", "selectivity": "control_selectivity",
            "control_overall_odds": "control_overall_odds", "max_iia": "max_iia", "completeness": "oracle_completeness",
            "overall_erasure": "overall_erasure", "erasure_selectivity": "erasure_selectivity"}


def _family(t: pd.DataFrame) -> list[str]:
    """The records' family of each row: ``direction`` for a DII (or the vanilla swap), else the intervention's kind."""
    edits = t["edit"] if "edit" in t else ["dii"] * len(t)
    return ["direction" if e in ("dii", "vanilla") else str(e) for e in edits]


def _overall_records(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and method the overall numbers of :func:`overall_table` (slice ``cg_task``) and their means over the
    tasks (slice ``{}``: Table 1's cells), plus the model's accuracy per task."""
    from cprobe.records import canonical

    overall = overall_table(table)
    if overall.empty:
        return pd.DataFrame()
    base = {"dataset": "causalgym"}
    family = dict(zip(overall["method"], _family(overall)))
    rows = []
    for rec in overall.to_dict("records"):
        sl = canonical({"cg_task": rec["cg_task"]})
        rows += [{**base, "family": family[rec["method"]], "model": rec["model"], "method": rec["method"], "slice": sl,
                  "metric": m, "value": rec[c], "n": rec["n_sites"] if c != "completeness" else rec["n_decodable_sites"]}
                 for c, m in _OVERALL.items() if c in rec]
    for (model, task), part in overall.groupby(["model", "cg_task"], sort=False):
        rows.append({"dataset": "causalgym", "model": model, "slice": canonical({"cg_task": task}),
                     "metric": "task_accuracy", "value": part["task_accuracy"].iloc[0]})
    for (model, method), part in overall.groupby(["model", "method"], sort=False):
        rows += [{**base, "family": family[method], "model": model, "method": method, "slice": "{}", "metric": m,
                  "value": part[c].mean(), "n": int(part[c].notna().sum())} for c, m in _OVERALL.items() if c in part]
    # read_layers: the oracle at read_layer l' reading the pass edited at layer l, one record per (row, l')
    fam = _family(table)
    for col in (c for c in table.columns if c.startswith(READ_PREFIX)):
        read = int(col[len(READ_PREFIX):])
        for k in np.flatnonzero(table[col].notna().to_numpy()):
            r = table.iloc[k]
            rows.append({**base, "family": fam[k], "model": r["model"], "method": r["method"], "layer": int(r["layer"]),
                         "read_layer": read, "position": r["region"],
                         "slice": canonical({"cg_task": r["cg_task"], "condition": r["condition"]}),
                         "metric": "oracle_completeness", "value": float(r[col]), "n": int(r["n_eval"])})
    return pd.DataFrame(rows)


def _record_items(table: pd.DataFrame, records: pd.DataFrame, values: pd.DataFrame | None) -> pd.DataFrame:
    from cprobe.records import breakdown_items

    return breakdown_items(records, list(_OVERALL.values()), "cg_task")


RECORDS = RecordSpec(
    dataset=const("causalgym"), model="model", layer="layer", read_layer=Derived(lambda t: t["layer"]),
    position="region", method="method", family=Derived(_family),
    setting=Derived(lambda t: [{"stream": s, **({} if pd.isna(lam) else {"probe_lam": lam})}
                               for s, lam in zip(t["stream"], t["probe_lam"])]),
    slice=("cg_task", "condition"),
    metrics={"odds": "avg_odds", "iia": "iia", "probe_accuracy": "direction_probe_accuracy",
             "oracle_accuracy": "oracle_accuracy", "completeness": "oracle_completeness",
             "oracle_selectivity": "oracle_selectivity", "erasure": "erasure", "erased_fraction": "erased_fraction",
             **{c: c for c in HELD_OUT}},
    n={"*": "n_eval", **{c: "sae_n" for c in HELD_OUT}}, breakdowns=("cg_task", "condition"), extra=_overall_records,
    items=_record_items, where_defined=HELD_OUT)
"""Per site (layer × region = position, task, condition): AvgOdds, IIA and the oracle scores; per task and over the
tasks: the overall odds-ratio and the control selectivity (:mod:`cprobe.records`). The tasks are the items of the
means over tasks."""
