"""The sites engine's plan: fitting at each site, the same for every study (docs/architecture.md, "The sites
engine"): :func:`memo_probe`, the one probe memo over the ``probe_fits`` cache; :class:`SiteFits`, an intervention
fitted at a site by its capabilities; :func:`fit_sites`, one per site, simultaneous or sequential;
:func:`minimal_pair_training`, what a direction trained through the model (DAS) fits on at a site (the reliability and
AxBench studies). What a method name is: :mod:`cprobe.methods`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cprobe.data.registry import minimal_pairs
from cprobe.errors import ConfigError, DataError
from cprobe.interventions import Intervention, fit_intervention
from cprobe.interventions.direction import Through
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import Vocabulary
from cprobe.models.resume import at_last
from cprobe.models.sites import Site
from cprobe.probes import Probe
from cprobe.probes.grid import fit_cached, fit_key

_MEMO: dict[str, Probe] = {}


def memo_probe(role: Mapping[str, Any], probe: Probe, X: Tensor, y: Tensor, cache_dir: Path | None = None,
               memo: dict[str, Probe] | None = None) -> tuple[Probe, str]:
    """Fit ``probe`` on (X, y) once: in ``memo`` (default: per process), and on disk in ``cache_dir`` (a sweep's
    jobs are separate processes) through the file-locked probe-fit cache (:func:`cprobe.probes.grid.fit_cached`).
    Both are keyed by what determines the fit (the states and labels by content, every probe setting and the seed:
    :func:`cprobe.probes.grid.fit_key`); the memo adds ``role`` (which oracle, or the interventional probe, on which
    states), so two roles never share one object. Returns (probe, where it came from: "fit", "memory" or "disk")."""
    k = json.dumps(dict(role), sort_keys=True, default=str) + fit_key(probe, X, y)  # type: ignore[arg-type]
    memo = _MEMO if memo is None else memo
    if k in memo:
        return memo[k], "memory"
    probe, source = fit_cached(probe, X, y, cache_dir=cache_dir)
    memo[k] = probe
    return probe, "disk" if source == "cache" else "fit"


@dataclass
class SiteFits:
    """Fitting at the sites of one study run: the probe-fit cache, the memo (the process's, or the caller's: CausalGym
    keeps one per site) and where each probe came from (``sources``: name → "fit" / "memory" / "disk")."""

    cache_dir: Path | None
    memo: dict[str, Probe] | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def probe(self, name: str, role: Mapping[str, Any], probe: Probe, X: Tensor, y: Tensor) -> Probe:
        """``probe`` fitted on (X, y) through :func:`memo_probe`; its source recorded under ``name``."""
        probe, self.sources[name] = memo_probe({**role, "name": name}, probe, X, y, self.cache_dir, self.memo)
        return probe

    def fit(self, method: Intervention, X: Tensor, z: Tensor, role: Mapping[str, Any],
            interventional: Callable[[], Probe] | None = None, through: Any = None, tag: str = "",
            oracles: Sequence[Probe] = ()) -> Intervention:
        """``method`` fitted at one site on (X, z) by its capabilities (:func:`~cprobe.interventions.fit_intervention`):
        ``needs_probe``: the site's interventional probe, ``interventional()`` fitted on (X, z) through the memo (its
        own object, never one of ``oracles``); ``needs_model``: ``through()``."""
        def site_probe() -> Probe:
            assert interventional is not None
            probe = self.probe(f"interventional{tag}", role, interventional(), X, z)
            assert all(probe is not o for o in oracles)
            return probe

        fit_intervention(method, X, z, probe=None if interventional is None else site_probe, through=through)
        return method


def fit_sites(adapter: ModelAdapter, items: Sequence[Any], formatter: Any, sites: Sequence[Site],
              clean: Mapping[Site, Tensor], fit: Any, mode: str, progress: bool = False) -> dict[Site, Intervention]:
    """Fit one intervention per site, in the order given (by layer): ``fit(site, X, upstream)`` gets the fitting
    items' states at the site — the clean ones (``simultaneous``: every site fitted on unedited states), or
    (``sequential``) the states read at the site in one forward pass with the edits fitted so far applied upstream
    (``upstream`` names them), so each eraser removes what is left after the ones before it.

    With two refits or more, the refit passes resume at the first site's layer (``compute.resume``,
    :mod:`cprobe.models.resume`): the fitting items' clean states there are computed once (blocks 1 … l₁, one
    layer's (N, T, d) states) and every refit runs blocks l₁+1 … l_k only; with one refit that would cost as much as
    the full pass, which then runs."""
    fitted: dict[Site, Intervention] = {}
    refits = len(sites) - 1 if mode == "sequential" else 0
    clean_at = None
    low = min(s.layer for s in sites)
    if refits >= 2 and adapter.can_resume and low >= 1:
        clean_at = adapter.clean_states(formatter.encode(items, adapter).batch(torch.arange(len(items))), [low])
    for s in sites:
        if mode == "sequential" and fitted:
            X = adapter.map(items, formatter, read=[s], edits={u: Apply(m) for u, m in fitted.items()},
                            desc=f"refit at layer {s.layer}" if progress else None, resume=clean_at).acts[s]
            fitted[s] = fit(s, X, list(fitted))
        else:
            fitted[s] = fit(s, clean[s], [])
    return fitted


def minimal_pair_training(adapter: Any, data: Any, ex: Any, rows: Any, layer: int, position: str, prop: str,
                          dataset_cfg: Mapping[str, Any], data_root: Path, progress: bool = False) -> Through:
    """What a direction trained through the model (``needs_model``: DAS) fits on, from the items ``rows`` (the
    intervention split): each base item's minimal-pair twin (the same sentence with only ``prop`` flipped,
    :func:`cprobe.data.registry.minimal_pairs`) is read at the site; training runs the base items with the site's
    coordinate along ``a`` interchanged toward the twin's (the 1-D DII) and maximises the log-probability of the
    twin's correct verb — the base's wrong one — over the whole vocabulary at the target (CausalGym eq. 12)."""
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
    everyone = enc.batch(torch.arange(len(base)))
    # every step resumes at the layer; at a causal LM's last token it runs that token alone over the prefix's cache
    clean = adapter.clean_states(everyone, [layer], kv=at_last(everyone, [site]))

    def forward(edit: Any, idx: Tensor) -> Tensor:
        b = enc.batch(idx.cpu())
        res = clean.take(idx, b.input_ids, b.attention_mask, adapter.name, adapter.device)
        return adapter.run(b, edits={site: edit}, readout=readout, grad=True, resume=res).scores

    return Through(forward, h_source, ex.candidates[torch.as_tensor(rows)][:, 1].long())
