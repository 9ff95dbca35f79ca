"""The sites engine's greedy decoding (models/multisite.py: extend, edited_generate) that MIB's study scores with, on a
tiny random model: clean decoding is the model's own greedy decoding, an edit holds in every step, and the
interchange through a featurizer is the row's source where the featurizer takes every feature."""

from __future__ import annotations

import torch

from cprobe.data.items import TextItem
from cprobe.models.adapter import ModelAdapter
from cprobe.models.featurizers import Identity, Subspace, rowwise_interchange
from cprobe.models.formatters import RegionFormatter
from cprobe.models.multisite import edited_generate, extend
from cprobe.models.sites import Batch, Site
from tests.conftest import make_random_model

TEXTS = [("the author", " near the guards"), ("the guards near", " the author is"), ("w1 w2", " w3")]


def _setup():
    model, tok = make_random_model("gpt_neox", seed=3)
    ad = ModelAdapter(model, tok, "causal", "neox")
    items = [TextItem(str(i), a + b, regions=(a, b)) for i, (a, b) in enumerate(TEXTS)]
    return ad, items, RegionFormatter()(items, ad, torch.arange(len(items)))


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
    return out


def test_extend_appends_each_rows_tokens_after_its_own_and_points_at_the_last():
    b = Batch(torch.tensor([[5, 6, 7], [5, 6, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]),
              {"last": torch.tensor([2, 1]), "region:0": torch.tensor([0, 0])}, torch.arange(2), "last")
    e = extend(b, torch.tensor([[8, 9], [3, 4]]))
    assert e.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 3, 4, 0]]
    assert e.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert e.pred == "next" and e.positions["next"].tolist() == [4, 3]
    assert e.positions["last"].tolist() == [2, 1]  # the prompt's positions keep naming the prompt's tokens


def test_clean_decoding_is_the_models_own_greedy_decoding():
    ad, items, batch = _setup()
    ids = edited_generate(ad, batch, torch.arange(3), [], lambda *_: {}, 3)
    for i in range(3):
        prompt = batch.input_ids[i, : int(batch.attention_mask[i].sum())].tolist()
        assert ids[i].tolist() == _greedy(ad.model, prompt, 3)


def test_the_whole_vector_of_the_last_layer_at_the_last_token_gives_the_sources_first_token():
    """Rows: item 0 interchanged from item 1's last-layer state at the last prompt token (Identity: every feature),
    and item 1 left alone by a subspace of zero columns: the first decoded token is item 1's own, both times."""
    ad, items, batch = _setup()
    L = ad.n_layers
    site = Site(L, "last")
    states = ad.map(items, RegionFormatter(), read=[site]).acts[site]
    clean = edited_generate(ad, batch, torch.arange(3), [], lambda *_: {}, 2)
    source = states[torch.tensor([1, 1])]
    feats = [Identity(ad.hidden_size), Subspace(torch.zeros(ad.hidden_size, 0))]

    def edits(rows, _, at):
        return {s: rowwise_interchange(source[rows], torch.tensor([0, 1])[rows], feats) for s in at}
    ids = edited_generate(ad, batch, torch.tensor([0, 1]), [site], edits, 2, row_site=torch.tensor([0, 0]))
    assert int(ids[0, 0]) == int(clean[1, 0]) and ids[1].tolist() == clean[1].tolist()
