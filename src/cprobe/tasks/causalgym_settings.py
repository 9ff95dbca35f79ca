"""CausalGym's settings: the ``causalgym:`` node's one schema (:class:`Config`), the paper's per-model values it
falls back to, the methods it accepts (direction methods and interventions, read from their registries) and the
regions it intervenes at. The engine that runs a task is :mod:`cprobe.tasks.causalgym_engine`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cprobe.config import parse
from cprobe.data.causalgym import TaskTemplate
from cprobe.data.causalgym_corpus import DEFAULT_TEMPLATES
from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from cprobe.methods import build, check, declares, is_intervention
from cprobe.models.sites import STREAMS

METHODS = ("das", "probe", "mean", "lda", "pca", "kmeans", "random")
"""The paper's seven direction methods; ``vanilla`` (the whole-vector swap) is the reference row beside them."""
CONDITIONS = ("task", "control")
CAPABLE_ACCURACY = 0.9
"""A task the model can do: un-intervened accuracy at least this and every label a known token."""
DEFAULT_ORACLE = {"name": "mlp", "n_layers": [1], "widths": [256], "lrs": [1e-3, 1e-2], "epochs": 8}
"""A small grid for the per-site oracle (cheap: 400 train vectors per site)."""

# The paper's probe penalties λ per model (App. C, Tables 3–20: Probe⁰ / Probe¹; reference ``probe_mapping``,
# C = 1/λ). Models above 70m run both probes (``probe0``, ``probe1``) and the summary reports the better of the two
# as ``probe`` (Table 1's "better of two probes"; the reference's ``pick_better_probe`` hard-codes Probe⁰ except
# for 410m, Probe¹ — REFERENCE_PICK). Used when neither ``causalgym.probe_lam`` nor the model config's
# ``task_defaults.causalgym.probe_lam`` is set; other models must set one.
PAPER_PROBE_LAMS = {"pythia_14m": (10.0,), "pythia_31m": (1e2,), "pythia_70m": (1e3,), "pythia_160m": (1e4, 1e5),
                    "pythia_410m": (1e4, 1e5), "pythia_1b": (1e5, 1e6), "pythia_1_4b": (1e5, 1e6),
                    "pythia_2_8b": (1e5, 1e6), "pythia_6_9b": (1e6, 1e7)}
REFERENCE_PICK = {"pythia_410m": 1}
PAPER_PROBE_LAM = {m: lams[REFERENCE_PICK.get(m, 0)] for m, lams in PAPER_PROBE_LAMS.items()}
PAPER_DAS = {"lr": 5e-3, "batch_size": 4, "epochs": 1, "warmup": 0.1, "parametrization": "orthogonal"}
DEFAULT_INTERVENTIONS: dict[str, dict[str, Any]] = {
    "inlp": {"rank": 1}, "rlace": {"rank": 1, "max_steps": 3000}, "leace": {}, "alterrep": {"rank": 1, "alpha": 1.0},
    "mean_diff": {"alpha": 1.0}, "fgsm": {"eps": 0.1}, "pgd": {"eps": 0.1, "steps": 40},
    "autoattack": {"eps": 0.1, "n_queries": 500}}
"""``causalgym.interventions``: the settings of each intervention when it is one of ``causalgym.methods`` (constructor
keys; a key given in the config replaces the one here). Rank 1 for the rank-r erasers, as CausalGym's methods are
1-D (and a rank-1 eraser's direction is then also scored as a DII direction, ``<name>_dir``); the gradient attacks'
L∞ radius is the reliability study's 0.1 (conf/intervention/*.yaml), 0.3–1 per-coordinate sd of the tiny model's
states; RLACE stops at 3000 steps (its rank-1 game converges well before on 400 vectors); AutoAttack's Square
search takes 500 queries."""



@dataclass(frozen=True)
class DASKeys:
    """``causalgym.das``: the causal method's training budget (null = the model's default, then the paper's). No
    ``k``: the paper's DII is 1-D, so a k-dimensional DAS is refused (an unknown key)."""

    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    warmup: float | None = None
    parametrization: str | None = None  # orthogonal (the reference's, default) | normalize (cprobe <= 0.3)


@dataclass(frozen=True)
class ModelDefaults:
    """A model config's ``task_defaults.causalgym`` node: its λ and DAS budget (the paper tunes λ per model)."""

    probe_lam: Any = None
    das: DASKeys = field(default_factory=DASKeys)


@dataclass(frozen=True)
class Config:
    """The ``causalgym:`` node — the one settings schema of the study (layers come from the top-level ``layers``,
    the seed from ``seed``). :meth:`resolve` fills the per-model values (λ, DAS budget) for a model."""

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
    probe_lam: Any = None  # λ, or a list of λs (one probe each; the summary keeps the better)
    stream: str = "block"  # last layer: "block" = raw block output (reference), "resid" = after the final norm
    das: DASKeys = field(default_factory=DASKeys)
    random_draws: int = 5
    reliability: bool = True
    oracle_probe: dict = field(default_factory=lambda: dict(DEFAULT_ORACLE))
    sites_per_pass: int | None = None  # DAS: sites trained in one batched pass (null: as model.batch_size allows)
    interventions: dict = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULT_INTERVENTIONS.items()})
    interventional_probe: dict | None = None  # the probe gradient attacks attack (null: oracle_probe's config)
    intervention_directions: bool = True  # a rank-1 intervention's direction also scored as a DII (<name>_dir)
    read_layers: bool = False  # oracles at every layer l' >= l read the forward pass edited at l

    def __post_init__(self) -> None:
        check(self.methods, "causalgym.methods")
        unknown = sorted(k for k in self.interventions or {} if k not in INTERVENTIONS)
        if unknown:
            raise ValueError(f"unknown intervention {unknown[0]!r} in causalgym.interventions; choose from "
                             f"{INTERVENTIONS.all_names()}")
        if self.read_layers and not self.reliability:
            raise ValueError("causalgym.read_layers needs causalgym.reliability=true (its oracles are the readers)")
        if self.n_train < 1 or self.n_eval < 1:
            raise ValueError("causalgym.n_train and causalgym.n_eval must be >= 1")
        if self.random_draws < 1:
            raise ValueError("causalgym.random_draws must be >= 1")
        if self.template_index < 0:
            raise ValueError(f"causalgym.template_index must be >= 0, got {self.template_index}")
        if self.sites_per_pass is not None and self.sites_per_pass < 1:
            raise ValueError(f"causalgym.sites_per_pass must be >= 1 or null, got {self.sites_per_pass}")
        if self.stream not in STREAMS:
            raise ValueError(f"unknown causalgym.stream {self.stream!r}; choose from {list(STREAMS)}")
        if self.tasks is not None and not self.tasks:
            raise ValueError("causalgym.tasks=[] selects no task; null runs every task of the templates file")
        check_regions_spec(self.regions)
        if self.probe_lam is not None and self.probe_lam != ():  # () once resolved for methods that take no λ
            lams = self.probe_lam if isinstance(self.probe_lam, (list, tuple)) else [self.probe_lam]
            if not lams or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in lams):
                raise ValueError(f"causalgym.probe_lam must be one λ > 0 or a list of them, got {self.probe_lam!r}")

    @property
    def resolved(self) -> bool:
        return isinstance(self.probe_lam, tuple) and None not in vars(self.das).values()

    def resolve(self, model: Mapping[str, Any]) -> Config:
        """This config with the model's values filled in: ``probe_lam`` a tuple of λs and every ``das`` key set.

        ``null`` values fall back to the model config's ``task_defaults.causalgym`` node (per-model tuning, as the
        paper's λ per model), then to the paper's values; a model outside the paper's table needs a λ when a method
        takes one."""
        per = parse(ModelDefaults, (model.get("task_defaults") or {}).get("causalgym"), "model.task_defaults.causalgym")
        das = {**PAPER_DAS, **{k: v for k, v in vars(per.das).items() if v is not None},
               **{k: v for k, v in vars(self.das).items() if v is not None}}
        lam = self.probe_lam if self.probe_lam is not None else per.probe_lam
        if lam is None:
            lam = PAPER_PROBE_LAMS.get(str(model.get("name")))
        takes = [m for m in self.methods if declares(m, "per_model_lambda")]
        if lam is None and takes:
            raise ConfigError(
                f"no probe λ for model {model.get('name')!r}: the paper tunes it per model (known: "
                f"{sorted(PAPER_PROBE_LAM)}); set causalgym.probe_lam=<λ> (C = 1/λ), e.g. 1e4 for a ~160m model")
        lams = tuple(float(x) for x in (lam if isinstance(lam, (list, tuple)) else [] if lam is None else [lam]))
        if takes and (not lams or min(lams) <= 0):
            raise ConfigError(f"causalgym.probe_lam must be one λ > 0 or a list of them, got {list(lams)}")
        for m in self.methods:
            if is_intervention(m):  # built once here, so a bad setting fails before any model loads
                try:
                    build(m, self.intervention_params(m), seed=0)
                except ConfigError as e:
                    raise ConfigError(f"bad causalgym.interventions.{m}: {e}") from None
            elif declares(m, "causal"):  # the `das` settings configure the causal method(s)
                try:
                    build(m, das, seed=0)
                except ConfigError as e:
                    raise ConfigError(f"bad causalgym.das: {e}") from None
        return dataclasses.replace(self, probe_lam=lams, das=DASKeys(**das))

    def intervention_params(self, name: str) -> dict[str, Any]:
        """The constructor settings of intervention ``name``: the defaults, then ``causalgym.interventions.<name>``."""
        return {**DEFAULT_INTERVENTIONS.get(name, {}), **dict((self.interventions or {}).get(name) or {})}


def check_regions_spec(spec: Any) -> None:
    """Syntax of ``causalgym.regions``: ``label``, ``all``, a region name or index, or a non-empty list of them."""
    if spec in ("label", "all", None):
        return
    items = [spec] if isinstance(spec, (int, str)) else spec
    if (isinstance(spec, bool) or not isinstance(items, (list, tuple)) or not items
            or any(isinstance(r, bool) or not isinstance(r, (int, str)) for r in items)):
        raise ValueError(f"causalgym.regions={spec!r}: use 'label', 'all', a region name or index, or a list of them")


def resolve_regions(spec: Any, template: TaskTemplate) -> list[int]:
    """Region indices to intervene at: by default the paper's (first label region … last)."""
    names = template.region_names
    if spec is None or spec == "label":
        return list(range(template.first_label_region, len(names)))
    if spec == "all":
        return list(range(len(names)))
    out = []
    for r in [spec] if isinstance(spec, (int, str)) else spec:
        if isinstance(r, int) and -len(names) <= r < len(names):
            out.append(r % len(names))
        elif isinstance(r, str) and r in names:
            out.extend(i for i, n in enumerate(names) if n == r)
        else:
            raise ConfigError(f"causalgym.regions: {r!r} is not a region of {template.name}; it has {list(names)}")
    return sorted(set(out))


@dataclass(frozen=True)
class MethodRun:
    """One scored method at every site: its row label, its registry name and constructor settings."""

    label: str
    name: str
    params: dict[str, Any]
    intervention: bool = False  # an intervention of cprobe.interventions (else a direction method)


def method_runs(config: Config) -> list[MethodRun]:
    """One run per method, read from its capabilities: a method taking the per-model λ (``per_model_lambda``, the
    probe) runs once per λ — as ``probe0`` and ``probe1`` for the paper's Probe⁰ / Probe¹ of models above 70m —
    a causal one gets the ``das`` budget, and an intervention its ``causalgym.interventions`` settings."""
    if not config.resolved:
        raise ValueError("method_runs needs a resolved config (Config.resolve)")
    out = []
    for name in config.methods:
        if is_intervention(name):
            out.append(MethodRun(name, name, config.intervention_params(name), intervention=True))
            continue
        cls = DIRECTIONS.get(name)
        if cls.per_model_lambda:
            lams = config.probe_lam
            out.extend(MethodRun(f"{name}{k}" if len(lams) > 1 else name, name, {"lam": lam})
                       for k, lam in enumerate(lams))
        elif cls.causal:
            out.append(MethodRun(name, name, dict(vars(config.das))))
        else:
            out.append(MethodRun(name, name, {}))
    return out
