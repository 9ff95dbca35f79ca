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

from cprobe.causalgym.corpus import DEFAULT_TEMPLATES
from cprobe.causalgym.runner import DEFAULT_ORACLE, METHODS, GymSettings, run_gym_task
from cprobe.causalgym.templates import load_templates
from cprobe.errors import ConfigError
from cprobe.job import JobContext
from cprobe.metrics.odds import overall_odds, selectivity
from cprobe.plots import new_figure, save
from cprobe.results import write_table

log = logging.getLogger("cprobe")

CAPABLE_ACCURACY = 0.9
"""Tasks the model can do (un-intervened accuracy at least this) get their own summary."""
DECODABLE_ACCURACY = 0.9
"""Sites whose oracle probe reaches this eval accuracy count for the overall completeness."""


# The paper's probe penalties λ per model (App. C, Tables 3–20: Probe⁰ / Probe¹; reference
# ``probe_mapping``, C = 1/λ). The default λ is the probe the reference picks for Table 1
# (``pick_better_probe``: Probe⁰ everywhere except 410m, Probe¹). Used when neither
# ``causalgym.probe_lam`` nor the model config's ``causalgym.probe_lam`` is set; other models must set one.
PAPER_PROBE_LAMS = {"pythia_14m": (10.0,), "pythia_31m": (1e2,), "pythia_70m": (1e3,), "pythia_160m": (1e4, 1e5),
                    "pythia_410m": (1e4, 1e5), "pythia_1b": (1e5, 1e6), "pythia_1_4b": (1e5, 1e6),
                    "pythia_2_8b": (1e5, 1e6), "pythia_6_9b": (1e6, 1e7)}
REFERENCE_PICK = {"pythia_410m": 1}
PAPER_PROBE_LAM = {m: lams[REFERENCE_PICK.get(m, 0)] for m, lams in PAPER_PROBE_LAMS.items()}
PAPER_DAS = {"lr": 5e-3, "batch_size": 4, "epochs": 1, "warmup": 0.1}


@dataclass(frozen=True)
class DASKeys:
    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    warmup: float | None = None


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
    probe_lam: float | None = None
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
        lam = per_model.get("probe_lam", PAPER_PROBE_LAM.get(str(model.get("name"))))
    if lam is None:
        if "probe" in g.methods:
            raise ConfigError(
                f"no probe λ for model {model.get('name')!r}: the paper tunes it per model (known: "
                f"{sorted(PAPER_PROBE_LAM)}); set causalgym.probe_lam=<λ> (C = 1/λ), e.g. 1e4 for a ~160m model")
        lam = 1.0  # unused: no probe method
    try:
        return GymSettings(
            methods=list(g.methods), layers=cfg.get("layers", "blocks"), regions=g.regions,
            n_train=g.n_train, n_eval=g.n_eval, train_seed=g.train_seed, eval_seed=g.eval_seed,
            control=g.control, prepend_bos=g.prepend_bos, probe_lam=float(lam), das=das, seed=int(cfg.get("seed", 0)),
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
    rows = []
    for name in names:
        t0 = time.perf_counter()
        rows.extend(run_gym_task(adapter, templates[name], settings, progress=ctx.progress, timings=ctx.timings))
        log.info("causalgym %s done in %.1fs", name, time.perf_counter() - t0)
    table = pd.DataFrame(rows)
    table.insert(0, "model", adapter.name)
    table["device"] = str(adapter.device)
    return table


# ---------------------------------------------------------------------------------- aggregation


def _grid(part: pd.DataFrame) -> np.ndarray:
    """(layers × regions) AvgOdds table of one task/method/condition (NaN where not a site)."""
    return part.pivot_table(index="layer", columns="region_idx", values="odds", aggfunc="mean").to_numpy()


def overall_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model × task × method (× seed): overall odds, selectivity, accuracies and cost."""
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
            rec["selectivity"] = selectivity(tgrid.to_numpy(), cgrid.to_numpy())
        rec.update(_reliability(task))
        rec["max_iia"] = float(task["iia"].max())
        rec["task_accuracy"] = float(task["task_accuracy"].iloc[0])
        rec["probe_accuracy"] = float(task["probe_accuracy"].mean()) if task["probe_accuracy"].notna().any() else np.nan
        rec["seconds"] = float((part["fit_s"] + part["eval_s"]).sum())
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


def summary_table(overall: pd.DataFrame) -> pd.DataFrame:
    """Method × model means over tasks (the paper's Table 1), plus the same over capable tasks."""
    if overall.empty:
        return overall
    rows = []
    for (model, method), part in overall.groupby(["model", "method"], sort=True):
        capable = part[part["task_accuracy"] >= CAPABLE_ACCURACY]
        rows.append({
            "model": model, "method": method, "n_tasks": part["cg_task"].nunique(),
            "overall_odds": part["overall_odds"].mean(), "selectivity": part["selectivity"].mean(),
            "n_capable_tasks": capable["cg_task"].nunique(),
            "capable_overall_odds": capable["overall_odds"].mean() if len(capable) else np.nan,
            "capable_selectivity": capable["selectivity"].mean() if len(capable) else np.nan,
            "completeness": part["completeness"].mean() if "completeness" in part else np.nan,
            "oracle_selectivity": part["oracle_selectivity"].mean() if "oracle_selectivity" in part else np.nan,
            "seconds": part["seconds"].sum(),
        })
    return pd.DataFrame(rows)


def report(table: pd.DataFrame, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    overall = overall_table(table)
    write_table(overall, out_dir / "causalgym_overall")
    write_table(summary_table(overall), out_dir / "causalgym_summary")
    task_rows = table[table["condition"] == "task"]
    for (model, name), part in task_rows.groupby(["model", "cg_task"], sort=True):
        _heatmaps(part, out_dir / f"heatmap_{model}_{name}.png", f"{model} · {name}")
    for model, part in task_rows.groupby("model", sort=True):
        _odds_by_layer(part, out_dir / f"odds_by_layer_{model}.png", str(model))


def _heatmaps(part: pd.DataFrame, path: Path, title: str) -> None:
    methods = [m for m in [*METHODS, "vanilla"] if m in set(part["method"])]
    fig, axes = new_figure(len(methods), width=3.2, height=3.2)
    regions = part.drop_duplicates("region_idx").sort_values("region_idx")
    vmax = float(np.nanmax(np.abs(part["odds"].to_numpy()))) or 1.0
    for ax, method in zip(axes, methods):
        grid = part[part["method"] == method].pivot_table(index="layer", columns="region_idx", values="odds",
                                                          aggfunc="mean")
        im = ax.imshow(grid.to_numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), [regions.set_index("region_idx").loc[c, "region"] for c in grid.columns],
                      rotation=60, fontsize=6)
        ax.set_yticks(range(grid.shape[0]), grid.index.tolist(), fontsize=7)
        ax.set(title=method, xlabel="region", ylabel="layer")
    fig.colorbar(im, ax=axes[-1], shrink=0.8, label="AvgOdds")
    fig.suptitle(title, fontsize=9)
    save(fig, path)


def _odds_by_layer(part: pd.DataFrame, path: Path, title: str) -> None:
    """Max-over-regions AvgOdds per layer, averaged over tasks, one line per method (paper Fig. 7)."""
    fig, axes = new_figure(1)
    ax = axes[0]
    per = part.groupby(["cg_task", "method", "layer"])["odds"].max().groupby(["method", "layer"]).mean()
    for method in [m for m in [*METHODS, "vanilla"] if m in per.index.get_level_values(0)]:
        s = per.loc[method]
        ax.plot(s.index, s.values, marker="o", label=method)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(title=title, xlabel="layer (0 = embeddings)", ylabel="max-over-regions AvgOdds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, path)
