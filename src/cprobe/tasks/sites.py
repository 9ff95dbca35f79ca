"""The sites engine's planning half: what each study fits where, before one edited pass scores it.

A study plans sites (where to edit) × methods (what to fit there) and reads oracles at every layer it scores. This
module fits them all alike: :func:`memo_probe` is the one probe memo (per process, and on disk through the probe-fit
cache ``probe_fits``, both keyed by the fit's content), :class:`SiteFits` fits an intervention at one site by its
capabilities with the site's interventional probe from that memo (never an oracle's object), and :func:`fit_sites`
fits one per site, simultaneously on clean states or sequentially on the states the upstream edits produce. The
edited pass itself is :func:`cprobe.models.multisite.edited_pass`; what a study scores is its own callback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cprobe.interventions import Intervention, fit_intervention
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply
from cprobe.models.sites import Site
from cprobe.probes import Probe
from cprobe.probes.grid import fit_cached, fit_key

_MEMO: dict[str, Probe] = {}


def memo_probe(role: Mapping[str, Any], probe: Probe, X: Tensor, y: Tensor, cache_dir: Path | None = None,
               memo: dict[str, Probe] = _MEMO) -> tuple[Probe, str]:
    """Fit ``probe`` on (X, y) once: in ``memo`` (default: per process), and on disk when ``cache_dir`` is set (a
    sweep's jobs are separate processes, so the disk copy saves refitting the oracles once per job).

    Both caches are keyed by what determines the fit — the training states and labels by content, every probe
    setting and the seed (:func:`cprobe.probes.grid.fit_key`) — so a fit is never served for other data; on disk
    through the file-locked probe-fit cache (:func:`cprobe.probes.grid.fit_cached`). ``role`` names the fit's role
    (which oracle, or the interventional probe, on which states): the in-process memo adds it, so two roles never
    share one probe object. Returns (probe, where it came from: "fit", "memory" or "disk")."""
    k = json.dumps(dict(role), sort_keys=True, default=str) + fit_key(probe, X, y)  # type: ignore[arg-type]
    if k in memo:
        return memo[k], "memory"
    probe, source = fit_cached(probe, X, y, cache_dir=cache_dir)
    memo[k] = probe
    return probe, "disk" if source == "cache" else "fit"


@dataclass
class SiteFits:
    """Fitting at each site for one study run: the probe-fit cache it fits through, its memo (the process's, or one
    of the caller's: CausalGym keeps one per site) and where every probe it used came from (``sources``: role name →
    "fit" / "memory" / "disk")."""

    cache_dir: Path | None
    memo: dict[str, Probe] = field(default_factory=lambda: _MEMO)
    sources: dict[str, str] = field(default_factory=dict)

    def probe(self, name: str, role: Mapping[str, Any], probe: Probe, X: Tensor, y: Tensor) -> Probe:
        """``probe`` fitted on (X, y) through :func:`memo_probe`; its source recorded under ``name``."""
        probe, self.sources[name] = memo_probe({**role, "name": name}, probe, X, y, self.cache_dir,
                                                self.memo)
        return probe

    def fit(self, method: Intervention, X: Tensor, z: Tensor, role: Mapping[str, Any],
            interventional: Callable[[], Probe] | None = None, through: Any = None, tag: str = "",
            oracles: Sequence[Probe] = ()) -> Intervention:
        """``method`` fitted at one site on (X, z) by its capabilities
        (:func:`cprobe.interventions.base.fit_intervention`): one that attacks a probe (``needs_probe``) is given
        the site's interventional probe, ``interventional()`` fitted on the same (X, z) through the memo (its own
        object, never one of ``oracles``); one trained through the model (``needs_model``) gets ``through()``."""
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
