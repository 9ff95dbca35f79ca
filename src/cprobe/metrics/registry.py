"""The metrics registry: every metric a study writes to its records, with its definition, direction, range and
paper reference (``cprobe list metrics`` prints it; ``tests/unit/test_records.py`` fails on an unregistered one).

One name means one thing across studies. Where two studies' tables used one column name for different quantities,
the records use distinct names: Canby et al.'s completeness/selectivity are ``oracle_completeness`` /
``oracle_selectivity`` (also CausalGym's per-site oracle scores, which are the same eq. 1 and eq. 3 at a site),
ConceptSHAP's is ``conceptshap_completeness``, and CausalGym's task − control odds is ``control_selectivity``.
The same metric may be recorded at several granularities (per site and the mean over sites, per relation and the
mean over relations): the record's ``slice`` and ``layer`` say which.

Add a metric: one :class:`Metric` entry in :data:`METRICS` (and the study's record mapping that writes it).

**Outside metrics** (a plugin's, or ``package.module:NAME``): a :class:`Metric` with ``inputs`` and ``fn``, listed in
the job config's ``metrics:``. ``inputs`` names what the metric reads, and so which studies compute it
(:data:`INPUTS`): ``edit`` — the states before and after an intervention's edit (the reliability study, per scored
test item), ``effect`` — the true and estimated effect vectors of each evaluation pair (CEBaB and LIBERTy, per
explainer). ``fn`` returns one value per item; the record's value is their mean, its per-item values feed the
leaderboard's bootstrap. Registered metrics appear in records, the leaderboard, the report and ``cprobe list metrics``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cprobe.errors import ConfigError, DataError
from cprobe.registry import BUILTIN, Provenance, Registry, target_of

HIGHER, LOWER, NEITHER = "higher", "lower", "neither"


@dataclass(frozen=True)
class Metric:
    """One metric. ``direction``: which way is better (``neither`` for diagnostics and effect sizes, where neither
    is); ``range``: (low, high), ``None`` for an open end; ``headline``: a leaderboard column (a study's main
    comparison), not a diagnostic; ``unit``: what the number counts in (``""`` for a plain fraction or score);
    ``decides``: a headline metric that is its study's overall score, which the yardsticks table ranks a method's
    settings by (:mod:`cprobe.yardsticks`; at most one per study)."""

    name: str
    title: str
    definition: str
    direction: str
    range: tuple[float | None, float | None]
    reference: str
    studies: tuple[str, ...] = ()
    headline: bool = False
    unit: str = ""
    decides: bool = False
    inputs: str | None = None
    """Outside metrics: what ``fn`` reads (a key of :data:`INPUTS`); None for the studies' own metrics."""
    fn: Callable[..., Any] | None = None
    """Outside metrics: ``fn(**inputs) -> (n,)`` one value per item (module doc)."""

    def contains(self, value: float) -> bool:
        """Is ``value`` in the metric's range (NaN, an undefined value, always is)?"""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return True
        lo, hi = self.range
        eps = 1e-9 * max(1.0, abs(value))
        return (lo is None or value >= lo - eps) and (hi is None or value <= hi + eps)

    @property
    def range_text(self) -> str:
        lo, hi = self.range
        return f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"


CANBY = "Canby et al. (2024)"
ARORA = "Arora et al. (2024), CausalGym"
CEBAB = "Abraham et al. (2022), CEBaB"
LIBERTY = "Toker et al. (2026), LIBERTy"
AXBENCH = "Wu et al. (2025), AxBench"
CAO = "Cao et al. (2022)"
HUANG = "Huang et al. (2024), RAVEL"
MUELLER = "Mueller et al. (2025), MIB"

_ENTRIES = [
    # ------------------------------------------------------------------ shared
    Metric("task_accuracy", "task accuracy",
           "The model's own accuracy on the study's items without any intervention (agreement: the correct verb form "
           "scored above the wrong one; CausalGym: the base label preferred over the source label).",
           HIGHER, (0, 1), f"{CANBY} §5 (Task Acc before); {ARORA} §4 (capable tasks: ≥ 0.9)",
           ("probing", "reliability", "causalgym", "ravel", "mib")),
    Metric("accuracy", "classifier accuracy",
           "Share of test items a classifier (the explained model, or a concept classifier) labels correctly.",
           HIGHER, (0, 1), f"{CEBAB} Table 8; {LIBERTY} §5", ("cebab", "liberty")),
    Metric("macro_f1", "classifier macro-F1",
           "Unweighted mean over classes of the per-class F1 of a classifier's predictions.",
           HIGHER, (0, 1), f"{CEBAB} Table 8; {LIBERTY} §5",
           ("cebab", "liberty")),
    Metric("sae_fvu", "SAE FVU (held out)",
           "Fraction of variance an SAE method's sparse autoencoder leaves unexplained on held-out states (the "
           "study's evaluation split at the site, never its training states): Σ‖x − x̂‖² / Σ‖x − x̄‖². 0 is a "
           "perfect reconstruction, 1 no better than the mean state.",
           LOWER, (0, None), "Gao et al. (2024) §2 (normalised MSE); Karvonen et al. (2025), SAEBench",
           ("reliability", "causalgym", "axbench", "ravel")),
    Metric("sae_l0", "SAE L0 (held out)",
           "Mean number of nonzero latents per held-out state of an SAE method's sparse autoencoder.",
           NEITHER, (0, None), "Gao et al. (2024); Karvonen et al. (2025), SAEBench",
           ("reliability", "causalgym", "axbench", "ravel"), unit="latents"),
    Metric("sae_dead_fraction", "SAE dead latents (held out)",
           "Share of an SAE method's latents that are zero on every held-out state.",
           LOWER, (0, 1), "Gao et al. (2024) §4 (dead latents); Karvonen et al. (2025), SAEBench",
           ("reliability", "causalgym", "axbench", "ravel")),
    # ------------------------------------------------------------------ probing
    Metric("probe_accuracy", "probe accuracy",
           "Held-out accuracy of a probe trained to predict the property (slice) from the hidden state read at "
           "read_layer (hyperparameters chosen on the validation split).",
           HIGHER, (0, 1), "Hewitt & Liang (2019); Belinkov (2022); " + CANBY + " §4 (oracle probes)", ("probing",),
           headline=True),
    Metric("majority_baseline", "majority baseline",
           "Accuracy of always predicting the training split's most frequent value, on the same test items: the "
           "chance level a probe accuracy is read against.",
           NEITHER, (0, 1), "Hewitt & Liang (2019)", ("probing", "reliability")),
    # ------------------------------------------------------------------ reliability (Canby et al.)
    Metric("oracle_completeness", "completeness",
           "How fully the intervention sets the targeted property, as an oracle probe reads it: 1 − TV(oracle "
           "distribution on the intervened state, goal) averaged over test items; the goal is the one-hot "
           "counterfactual value (eq. 1) or the uniform distribution for nullifying interventions (eq. 2). "
           "CausalGym: eq. 1 at a site (layer, region) with a per-site oracle, and the mean over the sites where the "
           "oracle decodes the property.",
           HIGHER, (0, 1), f"{CANBY} eqs. 1–2", ("reliability", "causalgym"), headline=True),
    Metric("oracle_selectivity", "selectivity",
           "How little the intervention disturbs non-targeted properties: 1 − TV(oracle distribution after, before)/m "
           "averaged over non-targeted properties (slice property: one of them) and test items.",
           HIGHER, (0, 1), f"{CANBY} eq. 3", ("reliability", "causalgym"), headline=True),
    Metric("reliability", "reliability",
           "Harmonic mean of oracle completeness and oracle selectivity (an F1 of the two).",
           HIGHER, (0, 1), f"{CANBY} §3 (reliability), Table 1", ("reliability",), headline=True, decides=True),
    Metric("intervened_task_accuracy", "task accuracy after",
           "The model's task accuracy when the intervened states are written back at the layer and the forward pass "
           "continues (counterfactual: the same items with the goal value).",
           NEITHER, (0, 1), f"{CANBY} §5 (Task Acc after)", ("reliability",)),
    Metric("delta_task_accuracy", "ΔTask Acc",
           "task_accuracy − intervened_task_accuracy on the same items: how much the model's behaviour changes when "
           "the property's representation is edited (large for a counterfactual edit of a property the model uses).",
           NEITHER, (-1, 1), f"{CANBY} Fig. 1b", ("reliability",), headline=True),
    Metric("oracle_accuracy", "oracle accuracy",
           "Test accuracy of the oracle probe for the property (slice) on original, un-intervened states; an oracle "
           "near its majority baseline makes completeness/selectivity for that property meaningless.",
           HIGHER, (0, 1), f"{CANBY} §4 (oracle probes), Table 1", ("reliability", "causalgym")),
    Metric("edited_oracle_accuracy", "oracle accuracy after the edit",
           "Accuracy, against each item's original value of the property (slice), of the oracle trained on clean "
           "states at the read layer, on the states of the forward pass edited at the (possibly earlier) edited "
           "layer: near the majority rate = erased there, near oracle_accuracy = untouched or rebuilt downstream, "
           "near 0 = a counterfactual edit that holds (issue 22: downstream read layers).",
           NEITHER, (0, 1), f"{CANBY} §4 oracles, read downstream of the edit", ("reliability",)),
    Metric("oracle_majority", "oracle majority baseline",
           "The majority baseline of the oracle's property on the test items.",
           NEITHER, (0, 1), f"{CANBY} §4", ("reliability",)),
    # ------------------------------------------------------------------ CausalGym (Arora et al.)
    Metric("avg_odds", "AvgOdds",
           "At one site (layer, region): the log odds-ratio of the source label over the base label after the "
           "interchange intervention along the direction, relative to before, averaged over the eval pairs.",
           HIGHER, (None, None), f"{ARORA} §5.1 (eq. 18)", ("causalgym",), unit="log odds"),
    Metric("cause", "Cause",
           "RAVEL: the share of interchanges on an entity's representation targeting attribute A, on prompts querying "
           "A, after which the model outputs the source entity's value of A.", HIGHER, (0, 1), f"{HUANG} §3",
           ("ravel",), headline=True),
    Metric("isolate", "Isolate",
           "RAVEL: the share of interchanges targeting attribute A, on prompts querying another attribute B, after "
           "which the model still outputs the base entity's value of B (the mean over B in a summary).", HIGHER,
           (0, 1), f"{HUANG} §3", ("ravel",), headline=True),
    Metric("disentangle", "disentanglement",
           "RAVEL's disentanglement score: the mean of Cause and Isolate.", HIGHER, (0, 1), f"{HUANG} §3",
           ("ravel",), headline=True, decides=True),
    Metric("iia", "IIA",
           "Interchange intervention accuracy at a site: the share of eval pairs whose intervened output prefers the "
           "source's label (CausalGym); MIB: whose greedy output, the base's features at the site taken from the "
           "source's, passes the task's checker against the causal model's counterfactual output.", HIGHER, (0, 1),
           f"{ARORA} §5.1; Geiger et al. (2022); {MUELLER} §4", ("causalgym", "mib")),
    Metric("mib_best", "MIB best layer",
           "MIB's highest accuracy across layers: per (layer, position) the IIA averaged over the counterfactual "
           "kinds, per layer the best position, then the best layer.", HIGHER, (0, 1),
           f"{MUELLER} §4 (aggregate_results.py: highest_accuracy)", ("mib",), headline=True),
    Metric("mib_mean", "MIB mean over layers",
           "MIB's average accuracy across layers: per (layer, position) the IIA averaged over the counterfactual "
           "kinds, per layer the best position, then the mean over layers.", HIGHER, (0, 1),
           f"{MUELLER} §4 (aggregate_results.py: average_accuracy)", ("mib",), headline=True, decides=True),
    Metric("max_iia", "max IIA", "The largest IIA over the task's sites.", HIGHER, (0, 1), f"{ARORA} §5.1",
           ("causalgym",), headline=True),
    Metric("overall_odds", "overall odds-ratio",
           "Eq. 19: the mean over layers of the max over regions of AvgOdds (per task; slice {} is the mean over "
           "tasks, Table 1).", HIGHER, (None, None), f"{ARORA} eq. 19, Table 1", ("causalgym",), headline=True,
           unit="log odds", decides=True),
    Metric("control_selectivity", "selectivity (control)",
           "Overall odds of the per-site difference task − control (the dog/give control task with the same inputs "
           "and arbitrary labels): how specific the direction is to the task's feature.",
           HIGHER, (None, None), f"{ARORA} §5.2, Table 1", ("causalgym",), headline=True, unit="log odds"),
    Metric("control_overall_odds", "control overall odds",
           "Overall odds-ratio (eq. 19) on the control task.", NEITHER, (None, None), f"{ARORA} §5.2",
           ("causalgym",), unit="log odds"),
    Metric("erasure", "erasure",
           "At one site, for an eraser (a nullifying intervention) in CausalGym: the mean over eval items of "
           "|m| − |m*|, with m = log p(y_b|b) − log p(y_s|b) on the clean run and m* the same with the erased state "
           "written back — how far the edit moved the log-odds toward 0 (|m| when the model is left indifferent).",
           HIGHER, (None, None), "cprobe (issue 22); " + ARORA + " eq. 9's log-odds", ("causalgym",), unit="log odds"),
    Metric("erased_fraction", "erased fraction",
           "At one site, for an eraser in CausalGym: 1 − Σ|m*| / Σ|m| over the eval items, the share of the clean "
           "|log-odds| the edit removed (1: indifferent on every item, 0: as decided as before).",
           HIGHER, (None, 1), "cprobe (issue 22)", ("causalgym",)),
    Metric("overall_erasure", "overall erasure",
           "Eq. 19 applied to an eraser's erasure: the mean over layers of the max over regions (per task; slice {} "
           "is the mean over tasks).", HIGHER, (None, None), f"{ARORA} eq. 19; cprobe (issue 22)", ("causalgym",),
           unit="log odds"),
    Metric("erasure_selectivity", "erasure selectivity (control)",
           "Overall erasure of the per-site difference task − control (the dog/give control labels): how specific "
           "the erasure is to the task's feature.", HIGHER, (None, None), f"{ARORA} §5.2; cprobe (issue 22)",
           ("causalgym",), unit="log odds"),
    Metric("direction_probe_accuracy", "direction probe accuracy",
           "Held-out accuracy of the classifier a supervised direction method fits at a site (probe, LDA).",
           NEITHER, (0, 1), f"{ARORA} §3", ("causalgym",)),
    # ------------------------------------------------------------------ AxBench (Wu et al.)
    Metric("detection_auroc", "detection AUROC",
           "Area under the ROC curve of a direction's concept score on held-out texts, texts with the concept (slice) "
           "against texts without it; a text's score pools the projections of its tokens' states on the direction "
           "(setting pooling: max over tokens as AxBench, mean, or the last token). 0.5 is chance.",
           HIGHER, (0, 1), f"{AXBENCH} (concept detection: ROC AUC)", ("axbench",), headline=True),
    # ------------------------------------------------------------------ CEBaB (Abraham et al.)
    *[Metric(f"icace_error_{d}", f"ICaCE-Error ({d})",
             f"Mean over evaluation edit pairs of the {label} between the true individual causal concept effect "
             "(the model's output distribution on the human-edited text minus on the original) and the explainer's "
             "estimate.", LOWER, rng, f"{CEBAB} eq. 6, Table 10, Fig. 2", ("cebab",), headline=True)
      for d, label, rng in (("l2", "L2 distance", (0, None)), ("cosine", "cosine distance", (0, 2)),
                            ("normdiff", "difference of L2 norms", (0, None)))],
    Metric("edit_pairs", "edit pairs", "Number of evaluation edit pairs for the aspect and direction.", NEITHER,
           (0, None), f"{CEBAB} Table 3", ("cebab",), unit="pairs"),
    Metric("ate", "ATE (data)",
           "The data's empirical average treatment effect of the aspect edit on the human overall rating (eq. 5, "
           "averaged over pairs; rating classes of the task).", NEITHER, (None, None), f"{CEBAB} eq. 5, Table 3",
           ("cebab",), unit="rating classes"),
    Metric("cace", "CaCE (model)",
           "The model's causal concept effect on its argmax class for the aspect and direction (mean over pairs).",
           NEITHER, (None, None), f"{CEBAB} eq. 4, Table 4", ("cebab",), unit="rating classes"),
    Metric("acace", "ACaCE (model)",
           "Mean over an aspect's value pairs of |CaCE|.", NEITHER, (0, None), f"{CEBAB} eq. 17, Table 4",
           ("cebab",), unit="rating classes"),
    Metric("conceptshap_completeness", "ConceptSHAP completeness",
           "ConceptSHAP's completeness score: how well the learned concept vectors recover the model's predictions "
           "(accuracy through the concept bottleneck relative to the model's, above chance).",
           HIGHER, (None, None), "Yeh et al. (2020) eq. 1; " + CEBAB + " §5", ("cebab", "liberty")),
    Metric("concept_probe_before", "removed-concept probe (before)",
           "Cross-validated accuracy of a fresh probe for the removed concept on the representation before removal "
           "(INLP / LEACE explainers).", NEITHER, (0, 1), f"{CEBAB} §5 (INLP)", ("cebab",)),
    Metric("concept_probe_after", "removed-concept probe (after)",
           "The same probe's accuracy after the concept's removal (near chance when removal worked).", LOWER, (0, 1),
           f"{CEBAB} §5 (INLP); Belrose et al. (2023)", ("cebab",)),
    Metric("concept_probe_majority", "removed-concept majority rate",
           "The majority-class rate of the removed concept on the probe's test rows: the chance level that "
           "concept_probe_after should fall to.", NEITHER, (0, 1), f"{CEBAB} §5 (INLP)", ("cebab", "liberty")),
    Metric("fallback_nearest", "nearest-match fallbacks",
           "Queries where Approx found no exact-match text and used the nearest one.", LOWER, (0, None),
           f"{CEBAB} §5 (Approx)", ("cebab", "liberty"), unit="queries"),
    Metric("fallback_none", "no-match fallbacks",
           "Queries where a matching explainer found no text at all and estimated a zero effect.", LOWER, (0, None),
           f"{CEBAB} §5; {LIBERTY} §4", ("cebab", "liberty"), unit="queries"),
    # ------------------------------------------------------------------ LIBERTy (Toker et al.)
    *[Metric(f"ed_{d}", f"ED ({d})",
             f"Error distance for one distance ({label}): the mean over concept-value changes of the mean per-pair "
             "distance between the true ICaCE (structural counterfactuals) and the estimate.",
             LOWER, rng, f"{LIBERTY} Def. 3", ("liberty",), headline=True)
      for d, label, rng in (("l2", "L2", (0, None)), ("cosine", "cosine", (0, 2)), ("normdiff", "difference of norms",
                                                                                   (0, None)))],
    Metric("ed", "ED", "The paper's reported error distance: the mean of ed_l2, ed_cosine and ed_normdiff.", LOWER,
           (0, None), f"{LIBERTY} Def. 3, Tables 1/15", ("liberty",), headline=True, decides=True),
    Metric("of", "OF", "Local order-faithfulness: over ordered pairs of changes sharing an example, the share of "
           "entries where the estimate orders the two effects as the truth does.", HIGHER, (0, 1),
           f"{LIBERTY} Def. 4, Tables 1/15", ("liberty",), headline=True),
    Metric("global_of", "global OF", "Concordance of the explainer's global concept-importance ranking with the "
           "gold ranking from true effects.", HIGHER, (0, 1), f"{LIBERTY} §5, Table 16", ("liberty",), headline=True),
    Metric("importance", "concept importance", "Global importance of a concept (slice): mean |effect| of its "
           "changes, from true effects (method gold) or an explainer's estimates.", NEITHER, (0, None),
           f"{LIBERTY} §5, Table 2", ("liberty",)),
    Metric("sensitivity", "sensitivity", "Σ|ICaCE| of the explained model per concept (slice), averaged over its "
           "changes.", NEITHER, (0, None), f"{LIBERTY} Table 17", ("liberty",)),
    Metric("true_effect", "true effect (SCM)", "The SCM's Monte-Carlo total effect of the concept on the label "
           "(the reference the explained model's sensitivity is read against).", NEITHER, (0, None),
           f"{LIBERTY} Table 17", ("liberty",)),
    # ------------------------------------------------------------------ prompt bias (Cao et al.)
    Metric("p_at_1", "P@1", "Precision at 1 (%) of the cloze query of one relation with one prompt (slice): the "
           "share of facts whose top prediction (stop words skipped) is the object.", HIGHER, (0, 100),
           f"{CAO} §3, Fig. 3", ("prompt_bias",), unit="%"),
    Metric("lama_p1", "LAMA P@1", "P@1 (%) with the relation's original (LAMA) prompt; slice {} is the mean over "
           "relations.", HIGHER, (0, 100), f"{CAO} Table 1", ("prompt_bias",), headline=True, unit="%"),
    Metric("worst_p1", "worst P@1", "P@1 (%) of the relation's worst prompt (mean over relations at slice {}).",
           HIGHER, (0, 100), f"{CAO} Table 1", ("prompt_bias",), unit="%"),
    Metric("best_p1", "best P@1", "P@1 (%) of the relation's best prompt (mean over relations at slice {}).", HIGHER,
           (0, 100), f"{CAO} Table 1", ("prompt_bias",), unit="%"),
    Metric("prompt_std", "prompt std", "Standard deviation (ddof 0) of P@1 over the relation's prompts (mean over "
           "relations at slice {}): how much the score depends on the wording.", LOWER, (0, 100),
           f"{CAO} Table 1", ("prompt_bias",), headline=True, unit="%"),
    Metric("prompt_diff", "prompt diff", "Best minus worst prompt P@1 of a relation (mean over relations at slice "
           "{}).", LOWER, (0, 100), f"{CAO} Table 1", ("prompt_bias",), unit="%"),
    Metric("prompt_diff_gt10_share", "% relations diff > 10", "Share (%) of relations whose best − worst prompt P@1 "
           "exceeds the threshold (10 points).", LOWER, (0, 100), f"{CAO} Table 1", ("prompt_bias",), unit="%"),
    Metric("verbalization_stability", "verbalization stability", "Share (%) of subjects whose prediction is the "
           "same under every mention (alias) of the subject (per relation; mean over relations at slice {}).",
           HIGHER, (0, 100), f"{CAO} Fig. 5", ("prompt_bias",), headline=True, unit="%"),
    Metric("p1_backdoor", "P@1 (backdoor)", "P@1 (%) after backdoor adjustment over prompts and mentions (mean "
           "over relations).", HIGHER, (0, 100), f"{CAO} §6", ("prompt_bias",), headline=True, unit="%"),
    Metric("true_knowledge", "true knowledge", "Fact world: share (%) of probed facts the model's training corpus "
           "stated at least known_min times.", NEITHER, (0, 100), f"{CAO} §4 (setting with known ground truth)",
           ("prompt_bias",), unit="%"),
    Metric("mean_exposure", "mean exposure", "Fact world: mean number of times the corpus states a probed fact.",
           NEITHER, (0, None), f"{CAO} §4", ("prompt_bias",), unit="mentions"),
    Metric("rank_instability", "rank instability", "Share (%) of relations on which the models' ordering by P@1 "
           "differs between at least two prompts.", LOWER, (0, 100), f"{CAO} §5", ("prompt_bias",), unit="%"),
    Metric("rank_consistency", "rank consistency", "Over bootstrap samples of relations, prompts and mentions: per "
           "model, the share (%) of samples in which it takes its most frequent rank; model '' (all): the share "
           "with the most frequent full ordering. method: the evaluation setting.", HIGHER, (0, 100),
           f"{CAO} Table 4", ("prompt_bias",), headline=True, unit="%"),
    Metric("rank_ties", "rank ties", "Share (%) of rank-consistency draws in which the model's score equals another "
           "model's (its rank then comes from the models' order, not its score); model 'any': draws with any tie.",
           LOWER, (0, 100), f"{CAO} Table 4 (diagnostic)", ("prompt_bias",), unit="%"),
    Metric("rank_pairs_gap", "pair score gap", "For a model pair a|b: the mean score gap b − a over the "
           "rank-consistency draws; the pair with the smallest |gap| is the closest pair.", NEITHER, (None, None),
           f"{CAO} Table 4 (diagnostic)", ("prompt_bias",), unit="P@1 points"),
    Metric("rank_pairs_tied", "pair ties", "For a model pair a|b: the share (%) of draws in which their scores tie.",
           LOWER, (0, 100), f"{CAO} Table 4 (diagnostic)", ("prompt_bias",), unit="%"),
    Metric("rank_pairs_flips", "pair flips", "For a model pair a|b: the share (%) of draws in which their order is "
           "the less frequent one; overall rank consistency cannot exceed 100 − flips of any pair.", NEITHER,
           (0, 50), f"{CAO} Table 4 (diagnostic)", ("prompt_bias",), unit="%"),
    Metric("disparity_p1", "P@1 after continued training", "Sample disparity: P@1 (%) with the original prompt "
           "after continued training on corpora with evidence share γ (setting); γ = -1: the base model.",
           NEITHER, (0, 100), f"{CAO} Table 3", ("prompt_bias",), unit="%"),
]

INPUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "edit": ("fn(before, after, z, z_target): before/after (n, d) float states at the edited site (read layer), z (n,) "
             "the targeted property's class ids, z_target (n,) the goal class (counterfactual) or None (nullifying)",
             ("reliability",)),
    "effect": ("fn(true, estimate): (n, K) the true and the explainer's estimated effect on the K class "
               "probabilities, one row per evaluation pair", ("cebab", "liberty")),
}
"""What an outside metric may read: input kind -> (signature, the studies that compute it)."""


def metric_problems(m: Any) -> list[str]:
    """What is wrong with a :class:`Metric` declaration (empty when nothing)."""
    out = []
    if not isinstance(m.name, str) or not m.name.isidentifier():
        out.append(f"name must be an identifier, got {m.name!r}")
    if m.direction not in (HIGHER, LOWER, NEITHER):
        out.append(f"direction must be {HIGHER!r}, {LOWER!r} or {NEITHER!r}, got {m.direction!r}")
    try:
        lo, hi = m.range
        if lo is not None and hi is not None and not lo < hi:
            out.append(f"range {m.range} is empty (low must be below high)")
    except (TypeError, ValueError):
        out.append(f"range must be (low, high) with None for an open end, got {m.range!r}")
    if m.decides and not m.headline:
        out.append("decides (the study's overall score) needs headline=True")
    if m.inputs is not None or m.fn is not None:
        if m.inputs not in INPUTS:
            out.append(f"inputs must be one of {sorted(INPUTS)}, got {m.inputs!r}")
        if not callable(m.fn):
            out.append("fn must be a function returning one value per item")
    return out


METRICS: dict[str, Metric] = {}
"""Every metric a record may hold: the studies' own, and the outside metrics a job resolved (:func:`resolve_metric`)."""
for _m in _ENTRIES:
    if _m.name in METRICS:
        raise ValueError(f"metric {_m.name!r} registered twice")
    if metric_problems(_m):
        raise ValueError(f"metric {_m.name!r}: {metric_problems(_m)}")
    METRICS[_m.name] = _m


def _accept(obj: Any, ref: str) -> Metric:
    """An outside metric: a :class:`Metric` with ``inputs`` and ``fn``, a name of its own (never a built-in's)."""
    if not isinstance(obj, Metric):
        from cprobe.registry import wrong_family

        raise wrong_family(obj, ref, "metric", "Metric")
    problems = metric_problems(obj)
    if obj.fn is None or obj.inputs is None:
        problems.append(f"an outside metric needs inputs (one of {sorted(INPUTS)}) and fn")
    if problems:
        raise ConfigError(f"metric {ref!r}: {'; '.join(problems)}")
    builtin = METRICS.get(obj.name)
    if builtin is not None and builtin is not obj and builtin.fn is None:
        raise ConfigError(f"metric {ref!r} is named {obj.name!r}, a built-in metric's name; a plugin never shadows a "
                          "built-in: rename it")
    return obj


METRIC_REGISTRY: Registry[Metric] = Registry("metric", group="cprobe.metrics", accept=_accept)
"""The metric family: built-ins (the studies' own, computed by them) and outside metrics (computed by ``fn``)."""
for _m in _ENTRIES:
    METRIC_REGISTRY.register(_m.name, _m, source=Provenance(BUILTIN, target_of(_m)))
SOURCES: dict[str, Provenance] = {}
"""Outside metrics resolved in this process: name -> provenance."""


def resolve_metric(ref: str) -> Metric:
    """The outside metric ``ref`` names (a registered name or ``package.module:NAME``), added to :data:`METRICS`."""
    m, src = METRIC_REGISTRY.resolve(ref)
    if src.builtin and m.fn is None:
        raise ConfigError(f"metrics: {ref!r} is a built-in metric, recorded by its studies already; list outside "
                          "metrics here (a plugin's, or package.module:NAME)")
    other = METRICS.get(m.name)
    if other is not None and other is not m:
        raise ConfigError(f"metric {ref!r} is named {m.name!r}, which another metric ({SOURCES.get(m.name, BUILTIN)}) "
                          "already uses")
    METRICS[m.name] = m
    SOURCES[m.name] = src
    return m


def outside_metrics(cfg: Mapping[str, Any], inputs: str) -> list[Metric]:
    """The config's ``metrics:`` that read ``inputs`` (a key of :data:`INPUTS`; the list is validated by the
    pipeline)."""
    return [m for m in (resolve_metric(str(r)) for r in cfg.get("metrics") or []) if m.inputs == inputs]


def compute(metric: Metric, **inputs: Any) -> np.ndarray:
    """``metric.fn(**inputs)`` as float64 (n,) per-item values, checked: one value per item, finite or NaN, inside the
    declared range — a DataError naming the metric otherwise."""
    n = _n_items(inputs)
    try:
        raw = metric.fn(**inputs)  # type: ignore[misc]
    except Exception as e:
        raise DataError(f"metric {metric.name!r} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        ) from None
    import torch

    v = raw.detach().cpu().double().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw, dtype=np.float64)
    if v.ndim == 0:
        v = np.full(n, float(v))
    if v.shape != (n,):
        raise DataError(f"metric {metric.name!r} returned shape {v.shape}; it must return one value per item ({n},)")
    if np.isinf(v).any():
        raise DataError(f"metric {metric.name!r} returned an infinite value")
    bad = [x for x in v if not metric.contains(float(x))]
    if bad:
        raise DataError(f"metric {metric.name!r} returned {bad[0]!r}, outside its declared range {metric.range_text}")
    return v


def _n_items(inputs: Mapping[str, Any]) -> int:
    for key in ("before", "true"):
        if key in inputs:
            return len(inputs[key])
    raise ValueError(f"unknown metric inputs {sorted(inputs)}")


def unregistered(names) -> list[str]:
    """The names in ``names`` that are not registered metrics, sorted."""
    return sorted({str(n) for n in names} - set(METRICS))
