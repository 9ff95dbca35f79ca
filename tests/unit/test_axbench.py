"""The AxBench detection study's pieces (issue 46 item 4, :mod:`cprobe.tasks.axbench`): concepts as name=value,
labels and splits of both item families, the one-class refusal, the capability refusals, the tokens formatter and
the scoring of planted directions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cprobe.data.base import Dataset, Example
from cprobe.data.items import TextItem
from cprobe.directions import DIRECTIONS, Direction
from cprobe.errors import ConfigError, DataError
from cprobe.models.formatters import TokensFormatter
from cprobe.tasks import axbench as ax
from tests.conftest import make_word_tokenizer


def test_concepts_are_name_value_or_name_not_value():
    assert ax.parse_concept("z_c=pl") == ("z_c", "pl", True)
    assert ax.parse_concept("fever!=Absent") == ("fever", "Absent", False)
    for bad in ("z_c", "=pl", "z_c=", "a=b=c", "a=b!=c"):
        with pytest.raises(ConfigError, match="is not name=value or name!=value"):
            ax.parse_concept(bad)


def _text(i: int, **concepts: str) -> TextItem:
    return TextItem(f"t{i}", f"w{i}", concepts)


def test_labels_binarise_and_leave_out_texts_without_a_value():
    """CEBaB's values: Positive is the concept, Negative and unknown are not; "" (unannotated) and "no majority" take
    no part; ``!=`` reverses which side is the concept."""
    units = [_text(0, food="Positive"), _text(1, food="Negative"), _text(2, food="unknown"), _text(3, food=""),
             _text(4, food="no majority"), _text(5)]
    assert ax.labels(units, "food=Positive").tolist() == [1, 0, 0, -1, -1, -1]
    assert ax.labels(units, "food!=Negative").tolist() == [1, 0, 1, -1, -1, -1]
    ex = [Example(f"e{i}", ("the", "author", "is"), 2, "is", "are", {"z_c": v}) for i, v in
          enumerate(["sg", "pl", "none"])]
    assert ax.labels(ex, "z_c=pl").tolist() == [0, 1, -1]


def _grammar(n: int) -> Dataset:
    return Dataset("g", tuple(Example(f"e{i}", ("the", "author", "is"), 2, "is", "are",
                                      {"z_c": "pl" if i % 2 else "sg"}) for i in range(n)), ("z_c",))


def test_split_of_an_agreement_dataset_is_seeded_and_of_a_text_dataset_its_own():
    cfg = ax.Config(test_share=0.3)
    a, b = ax.split(_grammar(20), cfg, 0), ax.split(_grammar(20), cfg, 0)
    assert len(a.test) == 6 and len(a.train) == 14 and [u.id for u in a.test] == [u.id for u in b.test]
    assert {u.id for u in a.test} != {u.id for u in ax.split(_grammar(20), cfg, 1).test}
    assert not {u.id for u in a.test} & {u.id for u in a.train}
    data = SimpleNamespace(name="c", splits={"train": (_text(0),), "dev": (_text(1),), "test": (_text(2), _text(3))})
    sp = ax.split(data, ax.Config(eval_split="dev"), 0)
    assert [u.id for u in sp.train] == ["t0"] and [u.id for u in sp.test] == ["t1"] and "dev" in sp.held_out
    assert len(ax.split(data, ax.Config(max_test=2), 0).test) == 2
    with pytest.raises(ConfigError, match=r"axbench.eval_split='val'; c has splits \['dev', 'test', 'train'\]"):
        ax.split(data, ax.Config(eval_split="val"), 0)


def test_a_concept_with_one_class_in_the_held_out_split_is_one_line():
    sp = ax.Split("d", [_text(0, food="Positive"), _text(1, food="Negative")],
                  [_text(2, food="Positive"), _text(3, food="")], "held-out (test)")
    with pytest.raises(DataError, match=r"concept 'food=Positive' has one class in the held-out \(test\) split of d "
                                        r"\(1 text\(s\) with it, 0 without\); AUROC needs both"):
        ax.checked_labels(sp, ["food=Positive"])
    with pytest.raises(DataError, match="one class in the training split"):
        ax.checked_labels(ax.Split("d", sp.test, sp.train, "x"), ["food=Positive"])
    with pytest.raises(ConfigError, match=r"unknown concept 'taste'; the texts of d have \['food'\]"):
        ax.checked_labels(sp, ["taste=Positive"])
    ok = ax.Split("d", sp.train, [*sp.test, _text(4, food="unknown")], "x")
    assert ax.checked_labels(ok, ["food=Positive"])["food=Positive"].tolist() == [1, 0, 1, -1, 0]


def test_methods_are_refused_by_capability_not_by_name():
    for name in DIRECTIONS.names():
        cls = DIRECTIONS.get(name)
        assert (ax.refusal(name) is not None) == (cls.causal or cls.whole_vector), name
    assert "trained through the model" in ax.refusal("das")


@pytest.mark.parametrize("kind", ["mlm", "causal"])
def test_the_tokens_formatter_reads_each_of_the_texts_own_tokens(kind):
    tok = make_word_tokenizer(kind)
    bos = tok.bos_token_id if kind == "causal" else None  # a causal LM's start token comes first (model.bos)
    adapter = SimpleNamespace(tok=tok, kind=kind, name="toy", max_length=32, bos_id=bos)
    items = [TextItem("a", "the author likes the guard"), TextItem("b", "the guards")]
    assert TokensFormatter.counts(items, adapter).tolist() == [5, 2]
    enc = TokensFormatter(3).encode(items, adapter)
    first = 1  # [CLS] / the start token
    assert enc.positions["token:0"].tolist() == [first, first]
    assert enc.positions["token:2"].tolist() == [first + 2, -1]
    assert set(enc.positions) == {"token:0", "token:1", "token:2"}
    with pytest.raises(ConfigError, match="n_tokens must be >= 1"):
        TokensFormatter(0)


def test_a_planted_direction_is_detected_and_chance_baselines_are_averaged():
    """Token states with the concept along e₀ on one token of each positive text: DiffMean and the probe find it
    (AUROC 1 with max pooling), and the random direction is scored over ``random_draws`` draws."""
    g = torch.Generator().manual_seed(0)
    n, T, d = 60, 4, 8
    H = torch.randn(n, T, d, generator=g) * 0.1
    y = torch.arange(n) % 2
    H[y == 1, 1, 0] += 3.0  # the concept on token 1 of every positive text
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[::3, 3] = False  # some shorter texts
    cfg = ax.Config(methods=["mean", "probe", "random"], random_draws=3)
    rows = ax.score_concept({2: H}, mask, y, torch.arange(40), torch.arange(40, 60), cfg, seed=0)
    by = {(r["method"], r["pooling"]): r for r in rows}
    assert len(rows) == 3 * 3 and {r["layer"] for r in rows} == {2}
    assert by[("mean", "max")]["auroc"] == 1.0 and by[("probe", "max")]["auroc"] == 1.0
    assert by[("random", "max")]["draws"] == 3 and by[("mean", "max")]["draws"] == 1


class Planted(Direction):  # a Direction of a user's own, by import path (as a plugin's)
    """Always e₀: what a registered method like an SAE latent's decoder direction looks like to the study."""

    supervised = True

    def fit(self, X, y):
        self.a = torch.nn.functional.one_hot(torch.tensor(0), X.shape[1]).float()
        return self


def test_any_registered_direction_is_scored_through_its_capabilities():
    g = torch.Generator().manual_seed(1)
    H = torch.randn(30, 3, 5, generator=g)
    y = torch.arange(30) % 2
    H[y == 1, 0, 0] += 5.0
    name = "tests.unit.test_axbench:Planted"
    assert ax.refusal(name) is None
    rows = ax.score_concept({0: H}, torch.ones(30, 3, dtype=torch.bool), y, torch.arange(20), torch.arange(20, 30),
                            ax.Config(methods=[name], poolings=["max"]), seed=0)
    assert [(r["method"], r["auroc"]) for r in rows] == [(name, 1.0)]


def test_a_method_that_finds_no_direction_gets_nan_and_says_why():
    """Equal states at a layer: the class means coincide, DiffMean has no direction (the others still score)."""
    H = torch.zeros(20, 2, 4)
    y = torch.arange(20) % 2
    rows = ax.score_concept({0: H}, torch.ones(20, 2, dtype=torch.bool), y, torch.arange(12), torch.arange(12, 20),
                            ax.Config(methods=["mean", "random"], poolings=["max"]), seed=0)
    mean, rnd = rows
    assert np.isnan(mean["auroc"]) and mean["draws"] == 0 and mean["note"] == "no direction: direction has zero or " \
        "non-finite norm"
    assert rnd["auroc"] == 0.5 and rnd["note"] == ""  # every score ties
