"""The reliability study (Canby et al. 2024): intervene on Z_c, score completeness, selectivity,
reliability against oracle probes, and ΔTask Acc by feeding the intervened states back.

One job = one intervention at one hyperparameter setting (a sweep runs a grid). Oracle probes and the
interventional probe shared by gradient attacks are memoised per process and cached on disk (checksummed
safetensors), so the jobs of a sweep train them once; activations come from the shared cache. The scoring
itself is the pure :func:`cprobe.metrics.reliability.score_intervention`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from cprobe.metrics.baselines import majority_baseline
from cprobe.data.registry import load_dataset
from cprobe.data.splits import make_splits
from cprobe.errors import ConfigError, DataError
from cprobe.extract import extract, resolve_layers, task_accuracy
from cprobe.interventions import INTERVENTIONS, Intervention
from cprobe.job import JobContext
from cprobe.tasks import Uses
from cprobe.models.load import fingerprint, resolve_device
from cprobe.metrics.reliability import (
    counterfactual_targets,
    oracle_informative,
    score_intervention,
)
from cprobe.models.edits import Replace
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
import cprobe.plots as plots
from cprobe.plots import new_figure, save
from cprobe.probes import Probe
from cprobe.probes.grid import load_probe, save_probe
from cprobe.records import Derived, RecordSpec
from cprobe.results import write_table

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "dataset", "split", "probe", "intervention", "layers", "position"))

_MEMO: dict[str, Probe] = {}
_PROBE_CACHE_VERSION = 3  # 3: checksummed files


@dataclass(frozen=True)
class Config:
    """The ``reliability:`` node."""

    target: str = "z_c"
    others: list[str] = field(default_factory=lambda: ["z_e"])
    oracle_probe: str = "mlp"  # a key of `probe` (probe=all has linear and mlp)
    interventional_probe: str = "mlp"  # the probe gradient attacks attack (never the oracle object)
    cache_probes: bool = True  # fitted oracle/interventional probes also cached on disk (CPROBE_CACHE_DIR)
    chance_margin: float = 0.02  # an oracle within this of its majority rate is flagged "at chance"


def validate(job: Any) -> None:
    rc: Config = job.task_cfg
    if job.keys.intervention is None:
        raise ConfigError(f"the reliability task needs an intervention: intervention=<one of {INTERVENTIONS.names()}>")
    icfg = dict(job.keys.intervention)
    hparam = icfg.pop("hparam", None)
    if hparam is not None and hparam not in icfg:
        raise ConfigError(f"intervention.hparam={hparam!r} is not a key of the intervention config {sorted(icfg)}")
    method = INTERVENTIONS.build(icfg, seed=job.keys.seed)
    if method.needs_model and job.keys.dataset is not None:
        from cprobe.data.registry import pairs_refusal

        why = pairs_refusal(job.keys.dataset, rc.target)
        if why:
            raise ConfigError(f"intervention {icfg['name']!r} is trained through the model on minimal pairs that "
                              f"flip {rc.target!r}: {why}")
    if rc.target in rc.others:
        raise ConfigError(f"reliability.others must not contain the target {rc.target!r}")
    if not rc.others:
        raise ConfigError("reliability.others is empty: selectivity needs at least one non-targeted property")
    for role in ("oracle_probe", "interventional_probe"):
        name = getattr(rc, role)
        if name not in (job.keys.probe or {}):
            raise ConfigError(f"reliability.{role}={name!r} is not configured; probe= has "
                              f"{sorted(job.keys.probe or {})} (use probe=all)")
    if job.keys.dataset is None or job.keys.split is None:
        raise ConfigError("the reliability task needs dataset= and split= (e.g. split=reliability)")
    from cprobe.data.registry import check_properties

    check_properties(job.keys.dataset, [rc.target, *rc.others], "reliability.target/others")
    fractions = job.keys.split.get("fractions", {})
    missing = [s for s in ("oracle", "intervention", "test") if s not in fractions]
    if missing:
        raise ConfigError(f"the reliability task needs oracle/intervention/test splits; split.fractions has "
                          f"{list(fractions)}")


def _memo_probe(key: Mapping[str, Any], probe: Probe, X: Tensor, y: Tensor,
                cache_dir: Path | None = None) -> tuple[Probe, str]:
    """Fit ``probe`` on (X, y) once per key: per process, and on disk when ``cache_dir`` is set (every method's
    sweep is its own process, so the disk copy saves refitting the oracles 8 times).

    Returns (probe, where it came from: "fit", "memory" or "disk").
    """
    k = json.dumps({**key, "v": _PROBE_CACHE_VERSION}, sort_keys=True, default=str)
    if k in _MEMO:
        return _MEMO[k], "memory"
    path = cache_dir / f"{hashlib.sha256(k.encode()).hexdigest()[:24]}.safetensors" if cache_dir else None
    if path is not None and path.is_file():
        loaded = load_probe(probe, path)
        if loaded is not None:
            _MEMO[k] = loaded
            return loaded, "disk"
    probe = probe.fit(X, y)
    _MEMO[k] = probe
    if path is not None:
        save_probe(probe, path)
    return probe, "fit"


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    t_job = time.perf_counter()
    cfg = ctx.cfg
    adapter = ctx.adapter(cfg["model"])
    ds = load_dataset(cfg["dataset"], ctx.data_root)
    for note in ds.notes:
        ctx.warn(note)
    layers = resolve_layers(cfg["layers"], adapter.n_layers)
    if len(layers) != 1:
        raise ConfigError(f"the reliability task takes one layer per job (got {layers}); sweep layers with -m")
    layer = layers[0]
    ex = extract(adapter, ds, [layer], cfg["position"], ctx.cache, progress=ctx.progress)
    for reason, n in ex.dropped.items():
        ctx.warn(f"dropped {n} of {len(ds)} items: {reason}")
    data = ex.dataset
    target, others = config.target, list(config.others)
    for p in (target, *others):
        if p not in data.properties:
            raise ConfigError(f"property {p!r} not in dataset {data.name!r}; it has {list(data.properties)}")
    seed = ctx.seed
    splits = make_splits(data, cfg["split"], seed)
    X = ex.acts[layer].float()
    values = {p: data.values(p) for p in (target, *others)}
    for p, v in values.items():
        if len(v) < 2:
            raise DataError(f"property {p!r} has {len(v)} value(s) other than 'none' in {data.name!r} ({v}); "
                            "the reliability study needs two or more")
    labels = {p: torch.from_numpy(data.labels(p, values[p])) for p in values}
    dev = str(resolve_device(ctx.device or "auto"))
    memo_base = {"acts": [adapter.name, fingerprint(adapter), str(adapter.dtype), data.fingerprint(), layer,
                          cfg["position"]], "seed": seed,
                 "split": cfg["split"]}
    probe_dir = ctx.cache_root / "probes" if config.cache_probes and ctx.cfg.get("cache", {}).get("enabled", True) \
        else None

    # Oracle probes: oracle split only, original embeddings only, one per property.
    t0 = time.perf_counter()
    oracles: dict[str, Probe] = {}
    sources: dict[str, str] = {}
    te = splits["test"]
    oracle_info: dict[str, Any] = {}
    for p in values:
        idx = splits["oracle"][labels[p][splits["oracle"]].numpy() >= 0]
        pc = cfg["probe"][config.oracle_probe]
        oracles[p], sources[f"oracle_{p}"] = _memo_probe(
            {**memo_base, "oracle": p, "probe": pc}, ctx.probe(pc), X[idx].to(dev), labels[p][idx].to(dev), probe_dir)
        ok = labels[p][te] >= 0
        acc = oracles[p].score(X[te][ok], labels[p][te][ok])
        majority = majority_baseline(labels[p][idx], labels[p][te][ok])
        informative = oracle_informative(acc, majority, config.chance_margin)
        oracle_info.update({f"oracle_acc_{p}": acc, f"oracle_majority_{p}": majority,
                            f"oracle_informative_{p}": informative})
        if not informative:
            ctx.warn(f"the {p} oracle is at chance on {adapter.name} layer {layer} (accuracy {acc:.3f} vs majority "
                     f"{majority:.3f}): {'completeness' if p == target else 'selectivity'} is not meaningful")
    t_oracle = time.perf_counter() - t0

    X_te, z_te = X[te], labels[target][te]
    if (z_te < 0).any():
        raise ConfigError(f"the target {target!r} must be defined for every item (some are {target}=none)")
    k = len(values[target])
    icfg = dict(cfg["intervention"])
    hparam = icfg.pop("hparam", None)
    name = icfg["name"]
    method: Intervention = INTERVENTIONS.build(icfg, seed=seed, device=ctx.device)
    inter = splits["intervention"]
    z_inter = labels[target][inter]
    t0 = time.perf_counter()
    if method.needs_probe:
        # The interventional probe: intervention split, its own object (never an oracle).
        pc = cfg["probe"][config.interventional_probe]
        probe, sources["interventional"] = _memo_probe(
            {**memo_base, "interventional": target, "probe": pc}, ctx.probe(pc), X[inter].to(dev), z_inter.to(dev),
            probe_dir)
        assert all(probe is not o for o in oracles.values())
        method.use_probe(probe)  # type: ignore[attr-defined]
    elif method.needs_model:
        # A direction trained through the frozen model (DAS) on the intervention split's minimal pairs.
        through = minimal_pair_training(adapter, data, ex, inter, layer, cfg["position"], target, cfg["dataset"],
                                        ctx.data_root, ctx.progress)
        method.fit(X[inter].to(dev), z_inter.to(dev), through=through)  # type: ignore[call-arg]
    else:
        method.fit(X[inter].to(dev), z_inter.to(dev))
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    if method.kind == "counterfactual":
        rows, z_goal = counterfactual_targets(z_te, k)
        X_new = method.transform(X_te[rows].to(dev), z_goal.to(dev)).float().cpu()
    else:
        rows, z_goal = torch.arange(len(te)), None
        X_new = method.transform(X_te.to(dev)).float().cpu()
    t_apply = time.perf_counter() - t0

    # ΔTask Acc: the same (test row, goal) items before and after writing the intervened states back.
    t0 = time.perf_counter()
    acc_before = acc_after = None
    if ex.scores is not None:
        items = te[rows.numpy()]
        acc_before = task_accuracy(ex.scores[items])
        written = adapter.map([data.examples[i] for i in items], AgreementFormatter((cfg["position"],)),
                              edits={Site(layer, cfg["position"]): Replace(X_new)},
                              readout=CandidateTokens(ex.candidates[items]),
                              desc="write-back" if ctx.progress else None)
        acc_after = task_accuracy(written.scores)
    t_task = time.perf_counter() - t0

    per_item: dict[str, Tensor] = {}
    scores = score_intervention(oracles, target, others, X_te[rows], X_new, z_goal,
                                {p: labels[p][te][rows] >= 0 for p in others}, acc_before, acc_after, per_item)
    _write_items(ctx.out_dir / ITEMS_FILE, te[rows.numpy()], z_goal, per_item)
    hval = icfg.get(hparam) if hparam else None
    row = {
        "model": adapter.name, "dataset": data.name, "dataset_source": data.source, "layer": layer,
        "position": cfg["position"], "target": target, "method": name, "kind": method.kind, "hparam": hparam,
        "hparam_value": None if hval is None else float(hval), **scores,
        "selectivity_valid": all(oracle_info[f"oracle_informative_{p}"] for p in others),
        **oracle_info, "oracle_probe": config.oracle_probe,
        "n_test": len(te), "n_scored": len(rows), "n_oracle": len(splits["oracle"]), "n_intervention": len(inter),
        "device": str(dev), "probe_source": ",".join(f"{k_}={v}" for k_, v in sources.items()),
        **{f"fit_{a}": getattr(method, a) for a in ("steps_run", "converged", "probe_accuracy") if hasattr(method, a)},
        "oracle_s": t_oracle, "fit_s": t_fit, "apply_s": t_apply, "task_s": t_task,
        "job_s": time.perf_counter() - t_job,
    }
    log.info("%s %s=%s: C=%.3f S=%.3f R=%.3f ΔTask=%s (%.1fs)", name, hparam, hval, scores["completeness"],
             scores["selectivity"], scores["reliability"], scores.get("delta_task_acc"), row["job_s"])
    return pd.DataFrame([row])


def minimal_pair_training(adapter: Any, data: Any, ex: Any, rows: Any, layer: int, position: str, prop: str,
                          dataset_cfg: Mapping[str, Any], data_root: Path, progress: bool = False) -> Any:
    """What a direction trained through the model (``needs_model``: DAS) fits on, from the items ``rows`` (the
    intervention split): each base item's minimal-pair twin (the same sentence with only ``prop`` flipped,
    :func:`cprobe.data.registry.minimal_pairs`) is read at the site; training runs the base items with the site's
    coordinate along ``a`` interchanged toward the twin's (the 1-D DII) and maximises the log-probability of the
    twin's correct verb — the base's wrong one — over the whole vocabulary at the target (CausalGym eq. 12)."""
    from cprobe.data.registry import minimal_pairs
    from cprobe.interventions.direction import Through
    from cprobe.models.readouts import Vocabulary

    if ex.scores is None or ex.candidates is None:
        raise ConfigError(f"model {adapter.name!r} has no LM head: a direction trained through the model (DAS) needs "
                          "its predictions")
    base = [data.examples[i] for i in rows]
    twins = minimal_pairs(dataset_cfg, data_root, prop, base)
    wrong = [t.id for b, t in zip(base, twins) if t.correct != b.wrong]
    if wrong:
        raise DataError(f"minimal-pair twin of {wrong[0]!r}: its correct verb is not the base's wrong one")
    fmt = AgreementFormatter((position,))
    site = Site(layer, position)
    h_source = adapter.map(twins, fmt, read=[site], desc="minimal pairs" if progress else None).acts[site]
    enc = fmt.encode(base, adapter)
    readout = Vocabulary()

    def forward(edit: Any, idx: Tensor) -> Tensor:
        return adapter.run(enc.batch(idx.cpu()), edits={site: edit}, readout=readout, grad=True).scores

    return Through(forward, h_source, ex.candidates[torch.as_tensor(rows)][:, 1].long())


_KIND_ORDER = {"counterfactual": 0, "nullifying": 1}


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 1: per method (and model/layer/oracle), the setting with maximum reliability.

    Counterfactual methods first, then nullifying, each by decreasing R; ``x_opt`` names the
    setting ("eps=0.112", "-" for LEACE); every ``oracle_acc_*`` column is kept.
    """
    t = table.dropna(subset=["reliability"]).reset_index(drop=True)  # idxmax needs unique labels
    if t.empty:
        return t
    keys = [c for c in ("model", "layer", "oracle_probe", "method") if c in t.columns]
    best = t.loc[t.groupby(keys, dropna=False)["reliability"].idxmax()].copy()
    best["x_opt"] = [_fmt_setting(h, v) for h, v in zip(best["hparam"], best["hparam_value"])]
    best["_kind"] = best["kind"].map(_KIND_ORDER).fillna(2)
    best = best.sort_values([*keys[:-1], "_kind", "reliability"], ascending=[True] * (len(keys) - 1) + [True, False])
    cols = [*keys, "kind", "x_opt", "completeness", "selectivity", "reliability", "task_acc_before",
            "task_acc_after", "delta_task_acc", *sorted(c for c in t.columns if c.startswith("oracle_acc_")),
            "selectivity_valid", "hparam", "hparam_value"]
    return best[[c for c in cols if c in best.columns]].reset_index(drop=True)


def _fmt_setting(hparam: Any, value: Any) -> str:
    if not isinstance(hparam, str) or value is None or pd.isna(value):
        return "-"
    v = float(value)
    return f"{hparam}={int(v)}" if v.is_integer() and hparam == "rank" else f"{hparam}={v:g}"


_FAMILIES = {  # the paper's appendix figures: 2 = GBIs, 3 = AlterRep (+ mean-difference), 4 = nullifying
    "fig2_gbi": ("fgsm", "pgd", "autoattack"),
    "fig3_linear_counterfactual": ("alterrep", "mean_diff"),
    "fig4_nullifying": ("inlp", "rlace", "leace"),
}


def _caption(fig: Any, shows: str, table: pd.DataFrame) -> None:
    """What every reliability figure names: the targeted property, model, data, n (test items) and seed."""
    plots.caption(fig, shows, property=[f"{t} (targeted)" for t in table["target"].unique()],
                  model=[f"{m} layer {l}" for m, l in table[["model", "layer"]].drop_duplicates().itertuples(index=False)],
                  data=table["dataset"], n=plots.counts(plots.values(table["n_test"]), "test items"),
                  seed=table.get("seed"))


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """Table 1 (Markdown/CSV) and Figs. 1a, 1b, 2–4 of the paper as PNGs (figures only for >1 row)."""
    best = table1(table)
    if not best.empty:
        write_table(best, out_dir / "table1")
    if len(table) < 2:
        return  # one sweep job: its own row is the table; figures come with `cprobe collect`
    methods = sorted(table["method"].unique())
    fig, (ax_a, ax_b) = new_figure(2)
    for m in methods:
        g = table[table["method"] == m].sort_values("hparam_value")
        ax_a.plot(g["completeness"], g["selectivity"], marker="o", ms=3, lw=0.8, label=m)
        if g["delta_task_acc"].notna().any():
            ax_b.plot(g["reliability"], g["delta_task_acc"], marker="o", ms=3, lw=0.8, label=m)
    ax_a.set(xlabel="completeness", ylabel="selectivity", title="Fig. 1a: selectivity vs completeness",
             xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax_b.set(xlabel="reliability", ylabel="ΔTask Acc", title="Fig. 1b: ΔTask Acc vs reliability")
    for ax in (ax_a, ax_b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _caption(fig, "Interventions: selectivity vs completeness, ΔTask Acc vs reliability (Canby et al. Fig. 1)", table)
    save(fig, out_dir / "fig1_tradeoffs.png")
    swept = [m for m in methods if table.loc[table["method"] == m, "hparam_value"].nunique() > 1]
    for stem, family in (*_FAMILIES.items(), ("fig_other", tuple(m for m in swept if not any(
            m in f for f in _FAMILIES.values())))):
        ms = [m for m in family if m in swept]
        if not ms:
            continue
        fig, axes = new_figure(len(ms), width=4.0)
        for ax, m in zip(axes, ms):
            g = table[table["method"] == m].sort_values("hparam_value")
            for metric, ls in (("reliability", "-"), ("completeness", "--"), ("selectivity", ":")):
                ax.plot(g["hparam_value"], g[metric], ls=ls, marker=".", label=metric)
            if g["delta_task_acc"].notna().any():
                ax.plot(g["hparam_value"], g["delta_task_acc"], ls="-.", color="grey", label="ΔTask Acc")
            hp = g["hparam"].iloc[0]
            ax.set(title=m, xlabel=hp, ylim=(-0.02, 1.02))
            if hp == "eps":
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        _caption(fig, "Reliability, completeness, selectivity and ΔTask Acc by hyperparameter",
                 table[table["method"].isin(ms)])
        save(fig, out_dir / f"{stem}_metrics_vs_hparam.png")


# ----------------------------------------------------------------------------------------------- records
ITEMS_FILE = "reliability_items.parquet"
"""Per scored test row (and goal value): its completeness and selectivity, the items of C and S."""


def _write_items(path: Path, test_rows: Any, z_goal: Tensor | None, per_item: dict[str, Tensor]) -> None:
    from cprobe.io import atomic_write_bytes
    from cprobe.records import parquet_bytes

    items = [str(int(i)) for i in test_rows] if z_goal is None else \
        [f"{int(i)}>{int(z)}" for i, z in zip(test_rows, z_goal.tolist())]
    frame = pd.DataFrame({"item": items, **{k: v.numpy() for k, v in per_item.items()}})
    atomic_write_bytes(path, parquet_bytes(frame))


def _record_items(table: pd.DataFrame, records: pd.DataFrame, out_dir: Path | None) -> pd.DataFrame | None:
    """The test rows of C and S (``reliability_items.parquet``): the items of the whole-set completeness and
    selectivity records."""
    from cprobe.records import item_rows

    path = None if out_dir is None else Path(out_dir) / ITEMS_FILE
    if path is None or not path.is_file():
        return None
    per = pd.read_parquet(path)
    whole = records[(records["slice"] == "{}") & records["metric"].isin(["oracle_completeness", "oracle_selectivity"])]
    values = {"oracle_completeness": per["completeness"].to_numpy(), "oracle_selectivity": per["selectivity"].to_numpy()}
    return item_rows(whole, values, per["item"])


def _setting(t: pd.DataFrame) -> list[dict]:
    """The swept hyperparameter ({} for LEACE) and the oracle probe the scores are read with."""
    return [{**({h: v} if isinstance(h, str) and h else {}), "oracle": o}
            for h, v, o in zip(t["hparam"], t["hparam_value"], t.get("oracle_probe", [""] * len(t)))]


RECORDS = RecordSpec(
    dataset="dataset", model="model", layer="layer", read_layer=Derived(lambda t: t["layer"]), position="position",
    method="method", family="kind", setting=Derived(_setting),
    metrics={"completeness": "oracle_completeness", "selectivity": "oracle_selectivity", "reliability": "reliability",
             "task_acc_before": "task_accuracy", "task_acc_after": "intervened_task_accuracy",
             "delta_task_acc": "delta_task_accuracy"},
    patterns={r"selectivity_(?!valid$)(.+)": ("oracle_selectivity", "property"),
              r"oracle_acc_(.+)": ("oracle_accuracy", "property"), r"oracle_majority_(.+)": ("oracle_majority", "property")},
    n={"oracle_accuracy": "n_test", "oracle_majority": "n_test", "*": "n_scored"}, breakdowns=("property",),
    items=_record_items)
"""Completeness, selectivity (overall and per non-targeted property: slice ``property``), reliability, ΔTask Acc and
the oracles' accuracies as records (:mod:`cprobe.records`); ``kind`` is the method family."""
