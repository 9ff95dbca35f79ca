"""The LM loss an SAE adds when spliced into the model: the state at a site replaced by the SAE's reconstruction
x̂ = decode(encode(x)) during the forward pass (:class:`cprobe.models.edits.Apply`, the edit machinery every study
uses), and the next-token distribution at the formatter's prediction position compared with the clean pass's.

The loss added is measured against the clean model's own predictions, so it needs no reference text:
``E_{p_clean}[−log p_spliced] − E_{p_clean}[−log p_clean] = KL(p_clean ‖ p_spliced)``, the mean over items. An SAE
that reconstructs exactly adds 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply
from cprobe.models.formatters import Formatter
from cprobe.models.readouts import NextToken
from cprobe.models.sites import Site
from cprobe.sae.dictionary import SAE


def loss_added(adapter: ModelAdapter, items: Sequence[Any], formatter: Formatter, site: Site, sae: SAE) -> float:
    """Mean KL(clean ‖ spliced) of the next-token distributions (nats) with ``sae``'s reconstruction at ``site``
    (module doc)."""
    clean = adapter.map(items, formatter, readout=NextToken()).scores
    spliced = adapter.map(items, formatter, edits={site: Apply(lambda h: sae.decode(sae.encode(h)))},
                          readout=NextToken()).scores
    assert clean is not None and spliced is not None
    return float((clean.double().exp() * (clean.double() - spliced.double())).sum(1).mean())
