"""Every cache of a fitted object is keyed by what the fit saw (issue 30): the training data's content, every setting
and the seed. A warm cache must never serve a fit made on other data — the reliability oracles' old key named the
states (model, layer, position) instead of hashing them, so a change that trained read-layer oracles on the wrong
layer's states was hidden by the cache."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cprobe.probes import build_probe
from cprobe.tasks import sites as rel

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

CFG = {"name": "linear", "lrs": [0.1], "epochs": 2, "batch_size": 16}
ROLE = {"acts": ["tiny", "fp", "float32", "data", 2, "target"], "oracle": "z_c", "probe": CFG}
"""The role key the study passes (what the states are meant to be): the same for every call below."""


def _data(n: int = 60):
    X = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return X, (X[:, 0] > 0).long()


@pytest.fixture
def memo():
    rel._MEMO.clear()
    yield
    rel._MEMO.clear()


def _fit(X, y, cache, seed: int = 0, cfg=CFG):
    return rel.memo_probe(ROLE, build_probe({**cfg, "seed": seed}), X, y, cache)


def test_one_changed_row_of_the_training_states_is_a_refit_in_memory_and_on_disk(tmp_path, memo):
    X, y = _data()
    p0, src0 = _fit(X, y, tmp_path)
    X1 = X.clone()
    X1[7, 2] += 0.5  # one row of the states: the same role key, other data
    p1, src1 = _fit(X1, y, tmp_path)
    assert (src0, src1) == ("fit", "fit") and p1 is not p0
    assert not torch.equal(p1.module.weight, p0.module.weight)  # fitted on the changed rows, not served the old fit
    expected = build_probe({**CFG, "seed": 0}).fit(X1, y)
    assert torch.equal(p1.predict_proba(X), expected.predict_proba(X))
    assert _fit(X, y, tmp_path)[1] == "memory" and _fit(X1, y, tmp_path)[1] == "memory"
    rel._MEMO.clear()  # a new process: both fits come back from disk, each to its own data
    (q0, s0), (q1, s1) = _fit(X, y, tmp_path), _fit(X1, y, tmp_path)
    assert (s0, s1) == ("disk", "disk")
    assert torch.equal(q0.predict_proba(X), p0.predict_proba(X)) and torch.equal(q1.predict_proba(X),
                                                                                 p1.predict_proba(X))
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


@pytest.mark.parametrize("change", ["label", "seed", "setting"])
def test_labels_seed_and_every_setting_are_in_the_key(tmp_path, memo, change):
    X, y = _data()
    _fit(X, y, tmp_path)
    y1 = y.clone()
    y1[3] = 1 - y1[3]
    args = {"label": dict(y=y1), "seed": dict(seed=1), "setting": dict(cfg={**CFG, "epochs": 3})}[change]
    _, src = _fit(X, args.get("y", y), tmp_path, seed=args.get("seed", 0), cfg=args.get("cfg", CFG))
    assert src == "fit"


def test_two_roles_on_the_same_data_share_the_disk_fit_but_never_one_object(tmp_path, memo):
    """The oracle and the interventional probe are separate objects (the study asserts it) even on equal data; the
    disk entry, keyed by content alone, is shared."""
    X, y = _data()
    a, _ = rel.memo_probe({"role": "oracle"}, build_probe({**CFG, "seed": 0}), X, y, tmp_path)
    b, src = rel.memo_probe({"role": "interventional"}, build_probe({**CFG, "seed": 0}), X, y, tmp_path)
    assert b is not a and src == "disk" and torch.equal(a.predict_proba(X), b.predict_proba(X))


def test_a_finetune_is_keyed_by_every_text_every_label_the_encoder_the_settings_and_the_seed():
    """The fine-tuned classifiers' cache key (:func:`cprobe.models.classifier.train_key`): one changed training text,
    one changed label, another encoder, another setting or seed is another entry."""
    from cprobe.data.items import TextItem
    from cprobe.models.classifier import FinetuneConfig, train_key

    items = [TextItem(str(i), f"text number {i}") for i in range(6)]
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    cfg = FinetuneConfig(epochs=1)
    base = train_key("enc", items, y, 2, cfg, 0)
    assert train_key("enc", list(items), y.clone(), 2, FinetuneConfig(epochs=1), 0) == base  # content, not identity
    one_text = [*items[:4], TextItem("4", "text number four"), items[5]]
    y1 = y.clone()
    y1[2] = 1
    keys = {train_key("enc", one_text, y, 2, cfg, 0), train_key("enc", items, y1, 2, cfg, 0),
            train_key("enc2", items, y, 2, cfg, 0), train_key("enc", items, y, 2, replace(cfg, lr=3e-5), 0),
            train_key("enc", items, y, 2, cfg, 1), train_key("enc", items, y, 3, cfg, 0)}
    assert len(keys) == 6 and base not in keys


def test_the_encoder_fingerprint_sees_a_weight_past_the_sampled_ones():
    """The fine-tune key's encoder part hashes every parameter's sum beside its first values: a change deep in a
    weight matrix is another encoder."""
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.load import fingerprint
    from tests.conftest import make_random_model

    model, tok = make_random_model("bert")
    adapter = ModelAdapter(model.bert, tok, "encoder", "tiny", batch_size=8)
    before = fingerprint(adapter)
    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.weight[20, 30] += 1e-3
    assert fingerprint(adapter) != before


def test_causalgyms_oracle_fits_through_the_probe_fit_cache_and_one_changed_row_refits(tmp_path, monkeypatch):
    """CausalGym's per-site oracle (and interventional probe: the same function) fits through
    :func:`cprobe.probes.grid.fit_cached`: the same states are read back, not refitted (weights equal to a fresh
    fit); one changed training row is a new entry, fitted on that row."""
    from cprobe.probes import grid
    from cprobe.tasks.causalgym_engine import oracle_probe
    from cprobe.tasks.sites import SiteFits

    def fit_oracle(X, y, cfg, seed, cache_dir=None):  # as CausalGym fits a site's oracle: the site's own memo
        return SiteFits(cache_dir, memo={}).probe("oracle", {}, oracle_probe(cfg, seed), X.float(), y)

    X, y = _data()
    fits = []
    real = grid.GridSearchProbe.fit

    def counted(self, *a, **k):
        fits.append(len(a[0]))
        return real(self, *a, **k)

    monkeypatch.setattr(grid.GridSearchProbe, "fit", counted)
    p0 = fit_oracle(X, y, CFG, 0, cache_dir=tmp_path)
    again = fit_oracle(X, y, CFG, 0, cache_dir=tmp_path)
    assert len(fits) == 1 and torch.equal(again.module.weight, p0.module.weight)
    X1 = X.clone()
    X1[7, 2] += 0.5
    p1 = fit_oracle(X1, y, CFG, 0, cache_dir=tmp_path)
    assert len(fits) == 2 and len(list(tmp_path.glob("*.safetensors"))) == 2
    assert torch.equal(p1.predict_proba(X), build_probe({**CFG, "seed": 0}).fit(X1, y).predict_proba(X))
    assert torch.equal(fit_oracle(X, y, CFG, 0).predict_proba(X), p0.predict_proba(X))  # no cache: the same fit
