"""A peer check kept in the suite (issue 30): CausalGym's 1-D interchange intervention rebuilt with plain PyTorch
forward hooks on the Hugging Face model — no cprobe code on that side: its own tokenisation (BOS + the sentence,
the site at the region's last token found from character offsets), one pair at a time (no padding), the edit
``h + ((s − h)·a) a`` written by a hook on the block's output, log-probabilities from the logits — against cprobe's
engine (the AvgOdds of ``run_gym_task`` along the direction it found) and its one entry point (``adapter.map`` with an
``Interchange`` edit), per pair and per site, to <= 1e-5 in log odds-ratio.

Only the data (the pairs, their texts and labels) come from cprobe; every model-side step is the peer's."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cprobe.compute import threads
from cprobe.data.causalgym import make_pair_splits
from cprobe.tasks.causalgym_engine import run_gym_task
from tests.conftest import numeric_threads
from tests.integration.test_causalgym_task import Side, _settings, adapter, template  # noqa: F401

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

TOL = 1e-5
SITES = [(0, "{subject}"), (1, "{subject}"), (1, "{object}"), (2, "{object}")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread (on a loaded 2-core box two threads ran the peer's loop 30x slower), or
    ``CPROBE_TEST_THREADS`` (``make test-portable``)."""
    with threads(numeric_threads(1)):
        yield


# ----------------------------------------------------------------------------------------------- the peer
def _encode(tok, regions: tuple[str, ...], region: int) -> tuple[torch.Tensor, int]:
    """(ids (1, T) with BOS first, the position of the last token of ``regions[region]``)."""
    text = "".join(regions)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    end = sum(len(r) for r in regions[:region + 1])  # the region's last character + 1
    pos = max(i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > a)
    return torch.tensor([[tok.bos_token_id, *enc["input_ids"]]]), pos + 1


def _module(model, layer: int):
    """The module whose output is the residual stream after block ``layer`` (0: the embeddings)."""
    return model.gpt_neox.embed_in if layer == 0 else model.gpt_neox.layers[layer - 1]


def _hidden(out):
    return out[0] if isinstance(out, tuple) else out


def _read(model, ids: torch.Tensor, layer: int, pos: int) -> torch.Tensor:
    got = {}

    def hook(module, args, out):
        got["h"] = _hidden(out)[0, pos].detach().clone()

    handle = _module(model, layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return got["h"]


def _last_logprobs(model, ids: torch.Tensor, edit=None) -> torch.Tensor:
    handle = None
    if edit is not None:
        layer, pos, fn = edit

        def hook(module, args, out):
            h = _hidden(out).clone()
            h[0, pos] = fn(h[0, pos])
            return (h, *out[1:]) if isinstance(out, tuple) else h

        handle = _module(model, layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits
    finally:
        if handle is not None:
            handle.remove()
    return logits[0, -1].float().log_softmax(-1)


def peer_log_odds(model, tok, pairs, layer: int, region: int, a: torch.Tensor) -> torch.Tensor:
    """Per pair: (log p(y_b|b) − log p(y_s|b)) + (log p(y_s|b*) − log p(y_b|b*)), b* = b with the site's state
    moved to the source's coordinate along unit ``a``."""
    a = a.float() / a.float().norm()
    out = []
    for p in pairs:
        ids_b, pos_b = _encode(tok, p.base, region)
        ids_s, pos_s = _encode(tok, p.source, region)
        s = _read(model, ids_s, layer, pos_s)
        yb = tok(p.base_label, add_special_tokens=False)["input_ids"][0]
        ys = tok(p.source_label, add_special_tokens=False)["input_ids"][0]
        clean = _last_logprobs(model, ids_b)
        edited = _last_logprobs(model, ids_b, (layer, pos_b, lambda h: h + ((s - h) @ a) * a))
        out.append(float((clean[yb] - clean[ys]) + (edited[ys] - edited[yb])))
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------------------------- the checks
@pytest.fixture(scope="module")
def engine(adapter, template):  # noqa: F811
    found: dict[str, torch.Tensor] = {}
    s = _settings(methods=["mean", "random"], layers="all", control=False, reliability=False)
    rows = pd.DataFrame(run_gym_task(adapter, template, *s, directions=found))
    return rows, found


@pytest.mark.parametrize(("layer", "name"), SITES)
def test_the_engines_avg_odds_equal_a_plain_hooks_interchange(adapter, template, engine, layer, name):  # noqa: F811
    rows, found = engine
    region = template.region_names.index(name)
    pairs = make_pair_splits(template, 8, 4).eval
    model = adapter.model
    for method in ("mean", "random"):
        a = found[f"{template.name}/task/{method}/L{layer}/R{region}"].reshape(-1)
        peer = peer_log_odds(model, adapter.tok, pairs, layer, region, a)
        got = rows.query("method == @method and layer == @layer and region == @name")["odds"].item()
        assert got == pytest.approx(float(peer.mean()), abs=TOL), method
        if method == "mean":
            assert peer.abs().max() > 1e-2  # the site reaches the output: not a vacuous 0 = 0


@pytest.mark.parametrize(("layer", "name"), SITES)
def test_the_entry_points_interchange_equals_the_peer_per_pair(adapter, template, engine, layer, name):  # noqa: F811
    from cprobe.metrics.odds import log_odds_ratio
    from cprobe.models.edits import Interchange

    _, found = engine
    region = template.region_names.index(name)
    pairs = make_pair_splits(template, 8, 4).eval
    a = found[f"{template.name}/task/mean/L{layer}/R{region}"].reshape(-1)
    base, src = Side(adapter, pairs, layer, region), Side(adapter, pairs, layer, region, "source")
    edited = adapter.map(base.items, base.fmt, edits={base.site: Interchange(src.acts, a / a.norm())},
                         readout=base.readout).scores
    ours = log_odds_ratio(base.scores[:, 0], base.scores[:, 1], edited[:, 0], edited[:, 1]).double()
    peer = peer_log_odds(adapter.model, adapter.tok, pairs, layer, region, a)
    assert ours.shape == peer.shape == (len(pairs),)
    assert (ours - peer).abs().max().item() <= TOL, (ours - peer).abs().max().item()
