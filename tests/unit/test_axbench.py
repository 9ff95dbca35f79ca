"""The AxBench detection study's pieces (issue 46 item 4, :mod:`cprobe.tasks.axbench`): concepts as name=value,
labels and splits of both item families, the one-class refusal, the capability refusals, the tokens formatter and
the scoring of planted directions."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from cprobe.data.base import Dataset, Example
from cprobe.data.items import TextItem
from cprobe.directions import DIRECTIONS, Direction
from cprobe.errors import ConfigError, DataError
from cprobe.interventions import INTERVENTIONS
from cprobe.methods import is_intervention
from cprobe.metrics.detection import auroc, orient, pool, token_scores
from cprobe.models.formatters import TokensFormatter
from cprobe.tasks import axbench as ax
from tests.conftest import make_word_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"


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
    """A direction method is refused only when it learns no direction (the whole-vector swap, a mask, features); an
    intervention when it trains through the model or exposes no direction (pgd); a name both registries know (das) is
    the direction."""
    for name in DIRECTIONS.names():
        cls = DIRECTIONS.get(name)
        assert (ax.refusal(name) is not None) == (cls.whole_vector or cls.feature_mask or cls.features), name
    for name in INTERVENTIONS.names():
        if is_intervention(name):
            cls = INTERVENTIONS.get(name)
            assert (ax.refusal(name) is not None) == (cls.needs_model or not cls.exposes_direction), name
    assert ax.refusal("das") is None and ax.refusal("leace") is None
    assert ax.refusal("pgd").startswith("intervention 'pgd' exposes no direction (exposes_direction is false)")


def test_das_is_refused_without_minimal_pairs_or_an_lm_head():
    """Checked on the configs alone: CEBaB emits no minimal pairs; the grammar flips z_c but not z_e; an encoder
    has no LM head to train through."""
    grammar = {"name": "synthetic_sva", "type": "synthetic", "grammar": {"n_sentences": 10, "seed": 0}}
    causal_lm, encoder = (yaml.safe_load((CONF / "model" / f"{m}.yaml").read_text())
                          for m in ("tiny_neox_sva", "minilm_l6"))
    assert ax.causal_refusal("das", grammar, ["z_c=pl"], causal_lm) is None
    why = ax.causal_refusal("das", {"name": "cebab"}, ["food=Positive"], causal_lm)
    assert why.startswith("direction method 'das' is trained through the model on minimal pairs that flip 'food': "
                          "dataset 'cebab' (type 'cebab') cannot emit minimal pairs")
    assert ax.causal_refusal("das", grammar, ["z_c=pl"], encoder).endswith("model 'minilm_l6' is 'encoder', with no "
                                                                          "LM head")
    assert ax.causal_refusal("das", grammar, ["z_c=pl", "z_e=pl"], causal_lm).endswith(
        "flip 'z_e': dataset 'synthetic_sva' can emit minimal pairs flipping ['z_c'], not 'z_e'")


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


def _noisy(seed: int, n: int = 80, T: int = 4, d: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token states where the concept is weak and spread over two dimensions: AUROCs strictly between 0.5 and 1."""
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(n, T, d, generator=g)
    y = torch.arange(n) % 2
    H[y == 1, :, 0] += 0.4
    H[y == 1, 2, 1] += 0.8
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[::4, 3] = False
    return H, y, mask


def test_an_intervention_is_scored_by_the_projection_on_its_edit_direction():
    """LEACE in axbench.methods: fitted on the training tokens' states and labels, its ``edit_direction()`` scores
    the held-out texts exactly as that vector scored directly through the detection metric. For a binary concept
    LEACE's edit direction is the class-mean difference, so its AUROC is DiffMean's; its family is intervention."""
    from cprobe.interventions.leace import LEACE

    H, y, mask = _noisy(3)
    train, test = torch.arange(56), torch.arange(56, 80)
    cfg = ax.Config(methods=["leace", "mean"], params={"leace": {"constrain_cov_trace": False}})
    rows = ax.score_concept({1: H}, mask, y, train, test, cfg, seed=0)
    by = {(r["method"], r["pooling"]): r for r in rows}
    X, y_tok = H[train][mask[train]], y[train][:, None].expand_as(mask[train])[mask[train]]
    a = LEACE(constrain_cov_trace=False).fit(X, y_tok).edit_direction()
    s_tok = X.double() @ a.double()
    a = orient(a, s_tok[y_tok == 1], s_tok[y_tok == 0])
    s = token_scores(H[test], mask[test], a)
    for p in ("max", "mean", "last"):
        want = auroc(pool(s, mask[test], p), y[test])
        assert 0.55 < want < 1.0  # a score that can tell a wrong direction or pooling apart
        assert by[("leace", p)]["auroc"] == pytest.approx(want, abs=1e-12)  # the same float64 steps
        # LEACE's and DiffMean's unit vectors agree to float32 rounding; no two held-out scores are that close
        assert by[("leace", p)]["auroc"] == pytest.approx(by[("mean", p)]["auroc"], abs=1e-12)
    assert by[("leace", "max")]["family"] == "intervention" and by[("mean", "max")]["family"] == "direction"
    assert by[("leace", "max")]["auroc"] != by[("leace", "last")]["auroc"]


def test_an_intervention_whose_edit_is_not_one_direction_gets_nan_and_says_why():
    """INLP removing two normals (rank 2) exposes no single direction: NaN at that layer, the reason in ``note``."""
    H, y, mask = _noisy(4)
    cfg = ax.Config(methods=["inlp"], params={"inlp": {"rank": 2}}, poolings=["max"])
    (row,) = ax.score_concept({0: H}, mask, y, torch.arange(56), torch.arange(56, 80), cfg, seed=0)
    assert np.isnan(row["auroc"]) and row["draws"] == 0
    assert row["note"] == "no direction: the fitted inlp edit is not one direction (rank > 1)"


def test_a_trained_causal_direction_is_scored_as_given():
    """A causal direction (DAS) comes trained through the model (``trained``, by method and layer); the study orients
    and scores it as any other: here the planted e₀, pointing away from the concept, is flipped (AUROC 1)."""
    g = torch.Generator().manual_seed(5)
    H = torch.randn(30, 3, 4, generator=g) * 0.1
    y = torch.arange(30) % 2
    H[y == 1, 1, 0] += 2.0
    e0 = -torch.nn.functional.one_hot(torch.tensor(0), 4).float()
    rows = ax.score_concept({2: H}, torch.ones(30, 3, dtype=torch.bool), y, torch.arange(20), torch.arange(20, 30),
                            ax.Config(methods=["das"], poolings=["max"]), seed=0, trained={("das", 2): e0})
    assert [(r["method"], r["family"], r["auroc"]) for r in rows] == [("das", "direction", 1.0)]
