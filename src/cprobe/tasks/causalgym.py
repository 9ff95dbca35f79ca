"""CausalGym (Arora et al. 2024): 1-D distributed interchange interventions along directions found
by DAS / probe / mean-difference / LDA / PCA / k-means / random (and the vanilla whole-vector swap),
scored by the log odds-ratio at every (layer, region) site, with dog/give control-task selectivity.

``run`` returns the long table (one row per CausalGym task × condition × method × layer × region);
``report`` writes the per-task overall table, the method × model summary (like the paper's Table 1),
layer × region heat-maps per method and odds-by-layer curves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cprobe.data.causalgym_corpus import DEFAULT_TEMPLATES
from cprobe.causalgym.runner import CAPABLE_ACCURACY, DEFAULT_ORACLE, METHODS, GymSettings, run_gym_task
from cprobe.data.causalgym import load_templates
from cprobe.errors import ConfigError
from cprobe.job import JobContext
from cprobe.metrics.odds import control_selectivity, overall_odds
from cprobe.plots import new_figure, save
from cprobe.records import Derived, RecordSpec, const
from cprobe.results import write_table

log = logging.getLogger("cprobe")

DECODABLE_ACCURACY = 0.9
"""Sites whose oracle probe reaches this eval accuracy count for the overall completeness."""


# The paper's probe penalties λ per model (App. C, Tables 3–20: Probe⁰ / Probe¹; reference
# ``probe_mapping``, C = 1/λ). Models above 70m run both probes (``probe0``, ``probe1``) and the summary
# reports the better of the two as ``probe`` (Table 1's "better of two probes"; the reference's
# ``pick_better_probe`` hard-codes Probe⁰ except for 410m, Probe¹ — REFERENCE_PICK). Used when neither
# ``causalgym.probe_lam`` nor the model config's ``causalgym.probe_lam`` is set; other models must set one.
PAPER_PROBE_LAMS = {"pythia_14m": (10.0,), "pythia_31m": (1e2,), "pythia_70m": (1e3,), "pythia_160m": (1e4, 1e5),
                    "pythia_410m": (1e4, 1e5), "pythia_1b": (1e5, 1e6), "pythia_1_4b": (1e5, 1e6),
                    "pythia_2_8b": (1e5, 1e6), "pythia_6_9b": (1e6, 1e7)}
REFERENCE_PICK = {"pythia_410m": 1}
PAPER_PROBE_LAM = {m: lams[REFERENCE_PICK.get(m, 0)] for m, lams in PAPER_PROBE_LAMS.items()}
PAPER_DAS = {"lr": 5e-3, "batch_size": 4, "epochs": 1, "warmup": 0.1, "parametrization": "orthogonal"}


@dataclass(frozen=True)
class DASKeys:
    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    warmup: float | None = None
    parametrization: str | None = None  # orthogonal (the reference's, default) | normalize (cprobe <= 0.3)


@dataclass(frozen=True)
class Config:
    """The ``causalgym:`` node (layers come from the top-level ``layers``, e.g. ``blocks``)."""

    templates: str = DEFAULT_TEMPLATES  # relative to the data dir
    template_index: int = 0
    tasks: list[str] | None = None  # None = every task of the templates file
    methods: list[str] = field(default_factory=lambda: [*METHODS, "vanilla"])
    regions: Any = "label"
    n_train: int = 200
    n_eval: int = 50
    train_seed: int = 42
    eval_seed: int = 1
    control: bool = True
    prepend_bos: bool = True
    probe_lam: Any = None  # λ, or a list of λs (one probe each; the summary keeps the better)
    stream: str = "block"  # last layer: "block" = raw block output (reference), "resid" = after the final norm
    das: DASKeys = field(default_factory=DASKeys)
    random_draws: int = 5
    reliability: bool = True
    oracle_probe: dict = field(default_factory=lambda: dict(DEFAULT_ORACLE))


def validate(job: Any) -> None:
    settings_from_cfg(job.cfg, job.task_cfg)


def settings_from_cfg(cfg: dict, g: Config) -> GymSettings:
    """The experiment's ``causalgym`` node; ``null`` DAS/probe values fall back to the model config's
    ``causalgym`` node (per-model tuning, as the paper's λ per model), then to the paper's values."""
    model = cfg.get("model") or {}
    per_model = model.get("causalgym") or {}
    das = {**PAPER_DAS, **{k: v for k, v in (per_model.get("das") or {}).items() if v is not None},
           **{k: v for k, v in vars(g.das).items() if v is not None}}
    lam = g.probe_lam
    if lam is None:
        lam = per_model.get("probe_lam", PAPER_PROBE_LAMS.get(str(model.get("name"))))
    if lam is None:
        if "probe" in g.methods:
            raise ConfigError(
                f"no probe λ for model {model.get('name')!r}: the paper tunes it per model (known: "
                f"{sorted(PAPER_PROBE_LAM)}); set causalgym.probe_lam=<λ> (C = 1/λ), e.g. 1e4 for a ~160m model")
        lam = 1.0  # unused: no probe method
    lams = list(lam) if isinstance(lam, (list, tuple)) else [lam]
    try:
        return GymSettings(
            methods=list(g.methods), layers=cfg.get("layers", "blocks"), regions=g.regions,
            n_train=g.n_train, n_eval=g.n_eval, train_seed=g.train_seed, eval_seed=g.eval_seed,
            control=g.control, prepend_bos=g.prepend_bos, probe_lams=[float(x) for x in lams], stream=g.stream,
            das=das, seed=int(cfg.get("seed", 0)),
            random_draws=g.random_draws, reliability=g.reliability, oracle_probe=dict(g.oracle_probe),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad causalgym config: {e}") from None


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    cfg = ctx.cfg
    settings = settings_from_cfg(cfg, config)
    path = Path(config.templates)
    templates = load_templates(path if path.is_absolute() else ctx.data_root / path, config.template_index)
    names = list(config.tasks or templates)
    unknown = [t for t in names if t not in templates]
    if unknown:
        raise ConfigError(f"unknown causalgym.tasks {unknown}; choose from {sorted(templates)}")
    adapter = ctx.adapter(cfg["model"])  # device=cuda puts the model (and every intervention) on the GPU
    rows: list[dict[str, Any]] = []
    directions: dict[str, torch.Tensor] = {}
    for name in names:
        t0 = time.perf_counter()
        rows.extend(run_gym_task(adapter, templates[name], settings, progress=ctx.progress, timings=ctx.timings,
                                 directions=directions))
        log.info("causalgym %s done in %.1fs", name, time.perf_counter() - t0)
    table = pd.DataFrame(rows)
    table.insert(0, "model", adapter.name)
    table["device"] = str(adapter.device)
    save_directions(directions, ctx.out_dir / DIRECTIONS_FILE, model=adapter.name, stream=settings.stream)
    incapable = sorted(table.loc[~table["capable"].astype(bool), "cg_task"].unique()) if len(table) else []
    if incapable:
        ctx.warn(f"{len(incapable)} of {len(names)} tasks are beyond {adapter.name} (accuracy < {CAPABLE_ACCURACY} "
                 f"or unknown label tokens): {', '.join(incapable)}; they are marked capable=false and the "
                 "summary also reports the capable tasks alone")
    return table


DIRECTIONS_FILE = "directions.safetensors"


def save_directions(directions: dict[str, torch.Tensor], path: Path, **meta: str) -> None:
    """Every learned unit direction (float32), keyed ``<task>/<condition>/<method>/L<layer>/R<region>``, as
    safetensors (no pickle), written atomically; load with :func:`load_directions`."""
    from safetensors.torch import save

    from cprobe.io import atomic_write_bytes

    if not directions:
        return
    blob = save({k: v.contiguous() for k, v in directions.items()}, metadata={k: str(v) for k, v in meta.items()})
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
    """Per model × task × method (× seed): overall odds, selectivity, accuracies and capability (what it cost is in
    the job's ``timings.csv``: tables never read timing columns, so a sweep's tables equal its jobs')."""
    keys = [k for k in ("model", "cg_task", "method", "seed") if k in table]
    out = []
    for key, part in table.groupby(keys, sort=True):
        rec = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        task = part[part["condition"] == "task"]
        if task.empty:
            continue
        tgrid = task.pivot_table(index="layer", columns="region_idx", values="odds", aggfunc="mean")
        rec["overall_odds"] = overall_odds(tgrid.to_numpy())
        control = part[part["condition"] == "control"]
        rec["selectivity"] = float("nan")
        rec["control_overall_odds"] = float("nan")
        if not control.empty:
            cgrid = control.pivot_table(index="layer", columns="region_idx", values="odds",
                                        aggfunc="mean").reindex_like(tgrid)
            rec["control_overall_odds"] = overall_odds(cgrid.to_numpy())
            rec["selectivity"] = control_selectivity(tgrid.to_numpy(), cgrid.to_numpy())
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
            "model": model, "method": method, "n_tasks": part["cg_task"].nunique(),
            "overall_odds": part["overall_odds"].mean(), "selectivity": part["selectivity"].mean(),
            "n_capable_tasks": capable["cg_task"].nunique(),
            "capable_overall_odds": capable["overall_odds"].mean() if len(capable) else np.nan,
            "capable_selectivity": capable["selectivity"].mean() if len(capable) else np.nan,
            "completeness": part["completeness"].mean() if "completeness" in part else np.nan,
            "oracle_selectivity": part["oracle_selectivity"].mean() if "oracle_selectivity" in part else np.nan,
            "probe_pick": "", "capable_probe_pick": "",
        })
    out = pd.DataFrame(rows)
    picks = []
    for model, part in out.groupby("model", sort=True):
        probes = part[part["method"].isin(["probe0", "probe1"])]
        if len(probes) == 2:
            best = probes.sort_values(["overall_odds", "method"], ascending=[False, True]).iloc[0].copy()
            best["probe_pick"] = str(best["method"])
            best["method"] = "probe"
            # over the capable tasks alone, the better of the two there (it may be the other one)
            cap = probes.sort_values(["capable_overall_odds", "method"], ascending=[False, True],
                                     na_position="last").iloc[0]
            for col in ("n_capable_tasks", "capable_overall_odds", "capable_selectivity"):
                best[col] = cap[col]
            best["capable_probe_pick"] = str(cap["method"])
            picks.append(best)
    if picks:
        out = pd.concat([out, pd.DataFrame(picks)], ignore_index=True)
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    return out.sort_values(["model", "method"], key=lambda c: c.map(order).fillna(99) if c.name == "method" else c,
                           kind="stable").reset_index(drop=True)


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
        _heatmaps(part, out_dir / f"heatmap_{model}_{name}.png", f"{model} · {name} (accuracy {acc:.2f}{cap})")
    for model, part in table[table["condition"] == "task"].groupby("model", sort=True):
        _odds_by_layer(part, out_dir / f"odds_by_layer_{model}.png", str(model))


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
    fig.suptitle(f"{title}\n{ylabel}", fontsize=11)
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
    save(fig, path)


# ----------------------------------------------------------------------------------------------- records
_OVERALL = {"overall_odds": "overall_odds", "selectivity": "control_selectivity",
            "control_overall_odds": "control_overall_odds", "max_iia": "max_iia", "completeness": "oracle_completeness"}


def _overall_records(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and method the overall numbers of :func:`overall_table` (slice ``cg_task``) and their means over the
    tasks (slice ``{}``: Table 1's cells), plus the model's accuracy per task."""
    from cprobe.records import canonical

    overall = overall_table(table)
    if overall.empty:
        return pd.DataFrame()
    base = {"dataset": "causalgym", "family": "direction"}
    rows = []
    for rec in overall.to_dict("records"):
        sl = canonical({"cg_task": rec["cg_task"]})
        rows += [{**base, "model": rec["model"], "method": rec["method"], "slice": sl, "metric": m, "value": rec[c],
                  "n": rec["n_sites"] if c != "completeness" else rec["n_decodable_sites"]}
                 for c, m in _OVERALL.items() if c in rec]
    for (model, task), part in overall.groupby(["model", "cg_task"], sort=False):
        rows.append({"dataset": "causalgym", "model": model, "slice": canonical({"cg_task": task}),
                     "metric": "task_accuracy", "value": part["task_accuracy"].iloc[0]})
    for (model, method), part in overall.groupby(["model", "method"], sort=False):
        rows += [{**base, "model": model, "method": method, "slice": "{}", "metric": m, "value": part[c].mean(),
                  "n": int(part[c].notna().sum())} for c, m in _OVERALL.items() if c in part]
    return pd.DataFrame(rows)


def _record_items(table: pd.DataFrame, records: pd.DataFrame, out_dir: Path | None) -> pd.DataFrame:
    from cprobe.records import breakdown_items

    return breakdown_items(records, list(_OVERALL.values()), "cg_task")


RECORDS = RecordSpec(
    dataset=const("causalgym"), model="model", layer="layer", read_layer=Derived(lambda t: t["layer"]),
    position="region", method="method", family=const("direction"),
    setting=Derived(lambda t: [{"stream": s, **({} if pd.isna(lam) else {"probe_lam": lam})}
                               for s, lam in zip(t["stream"], t["probe_lam"])]),
    slice=("cg_task", "condition"),
    metrics={"odds": "avg_odds", "iia": "iia", "probe_accuracy": "direction_probe_accuracy",
             "oracle_accuracy": "oracle_accuracy", "completeness": "oracle_completeness",
             "oracle_selectivity": "oracle_selectivity"},
    n={"*": "n_eval"}, breakdowns=("cg_task", "condition"), extra=_overall_records, items=_record_items)
"""Per site (layer × region = position, task, condition): AvgOdds, IIA and the oracle scores; per task and over the
tasks: the overall odds-ratio and the control selectivity (:mod:`cprobe.records`). The tasks are the items of the
means over tasks."""
