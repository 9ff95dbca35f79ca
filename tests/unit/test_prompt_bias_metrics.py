"""Prompt-bias metrics (Cao et al. 2022) on hand-built prediction tables, every value computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cprobe.errors import ConfigError
from cprobe.metrics import prompt_bias as M


def table(rows):
    """rows: (model, relation, prompt, subject, mention, prediction, correct)."""
    return pd.DataFrame(rows, columns=["model", "relation", "prompt", "subject", "mention", "prediction", "correct"])


def p1_frame(values):
    """values: {(model, relation): [P@1 per prompt]} -> a precision_at_1-shaped frame."""
    return pd.DataFrame([{"model": m, "relation": r, "prompt": p, "p1": v, "n": 10}
                         for (m, r), vs in values.items() for p, v in enumerate(vs)])


def test_precision_at_1_default_mention_and_per_subject_mean():
    t = table([
        ("m", "R1", 0, "s1", 0, "a", True), ("m", "R1", 0, "s1", 1, "b", False),
        ("m", "R1", 0, "s2", 0, "c", False),
        ("m", "R1", 1, "s1", 0, "a", True), ("m", "R1", 1, "s2", 0, "a", True),
    ])
    p = M.precision_at_1(t).set_index("prompt")
    assert p.loc[0, "p1"] == pytest.approx(50.0) and p.loc[0, "n"] == 2  # mention 0 only: s1 right, s2 wrong
    assert p.loc[1, "p1"] == pytest.approx(100.0)
    # every mention: per subject first (s1: 0.5, s2: 0), then over subjects -> 25, not the flat 1/3
    assert M.precision_at_1(t, mention=None).set_index("prompt").loc[0, "p1"] == pytest.approx(25.0)


def test_prompt_spread_uses_population_std_and_original_prompt():
    s = M.prompt_spread(p1_frame({("m", "R1"): [50.0, 25.0, 75.0]})).iloc[0]
    assert (s["original"], s["worst"], s["best"], s["diff"]) == (50.0, 25.0, 75.0, 50.0)
    assert s["std"] == pytest.approx(math.sqrt((0 + 25**2 + 25**2) / 3))  # ddof 0 (20.41), not ddof 1 (25)


def test_table1_averages_over_relations_and_counts_large_gaps():
    spread = M.prompt_spread(p1_frame({("m", "R1"): [40.0, 45.0], ("m", "R2"): [10.0, 30.0, 20.0]}))
    t = M.table1(spread).iloc[0]
    assert t["lama_p1"] == pytest.approx((40 + 10) / 2)
    assert t["worst_p1"] == pytest.approx((40 + 10) / 2) and t["best_p1"] == pytest.approx((45 + 30) / 2)
    assert t["diff"] == pytest.approx((5 + 20) / 2)
    assert t["diff_gt10_share"] == pytest.approx(50.0)  # R2's gap of 20 > 10; R1's 5 is not
    assert t["std"] == pytest.approx((2.5 + np.std([10.0, 30.0, 20.0])) / 2)


def test_rank_instability_counts_relations_whose_ordering_flips():
    p = p1_frame({("a", "R1"): [10.0, 20.0], ("b", "R1"): [30.0, 40.0],   # b > a under both prompts: stable
                  ("a", "R2"): [10.0, 50.0], ("b", "R2"): [30.0, 40.0]})  # flips: unstable
    assert M.rank_instability(p) == pytest.approx(50.0)
    assert math.isnan(M.rank_instability(p[p["model"] == "a"]))


def test_ordering_rounds_to_two_decimals_and_breaks_ties_stably():
    assert M.ordering([3.0, 1.0, 2.0]) == (1, 2, 0)  # worst to best
    assert M.ordering([1.004, 1.001]) == (0, 1)  # equal after rounding: index order
    assert M.ordering([1.004, 1.001], decimals=None) == (1, 0)


def test_verbalization_stability_over_subjects_with_two_or_more_mentions():
    t = table([
        ("m", "R1", 0, "s1", 0, "x", True), ("m", "R1", 0, "s1", 1, "x", True),   # stable
        ("m", "R1", 0, "s2", 0, "x", True), ("m", "R1", 0, "s2", 1, "y", False),  # changes
        ("m", "R1", 0, "s3", 0, "z", True),                                        # one mention: not counted
        ("m", "R1", 1, "s2", 0, "y", False), ("m", "R1", 1, "s2", 1, "y", False),  # another prompt: ignored
    ])
    s = M.verbalization_stability(t).iloc[0]
    assert s["stability"] == pytest.approx(50.0) and s["subjects"] == 2
    assert M.verbalization_stability(t, prompt=1).iloc[0]["stability"] == pytest.approx(100.0)


def cube_table():
    # 2 prompts x 2 subjects; s1 has 2 mentions, s2 one
    return table([
        ("m", "R", 0, "s1", 0, "", True), ("m", "R", 0, "s1", 1, "", False), ("m", "R", 0, "s2", 0, "", False),
        ("m", "R", 1, "s1", 0, "", True), ("m", "R", 1, "s1", 1, "", True), ("m", "R", 1, "s2", 0, "", True),
    ])


def test_settings_original_and_backdoor_by_hand():
    c = M.cubes(cube_table())[("m", "R")]
    assert c.correct.shape == (2, 2, 2) and c.n_mentions.tolist() == [2, 1]
    rng = np.random.default_rng(0)
    assert M.relation_score(c, "original", rng) == pytest.approx(50.0)  # prompt 0, mention 0: s1 right, s2 wrong
    # backdoor: prompt 0 -> subjects (0.5, 0) -> 0.25; prompt 1 -> (1, 1) -> 1; mean 0.625
    assert M.relation_score(c, "backdoor", rng) == pytest.approx(62.5)
    # sampling every prompt and mention is the full backdoor average
    assert M.relation_score(c, "backdoor_sampled", rng, k_prompts=5, k_mentions=5) == pytest.approx(62.5)


def test_random_setting_draws_uniformly_over_prompts_and_mentions():
    c = M.cubes(cube_table())[("m", "R")]
    rng = np.random.default_rng(1)
    draws = [M.relation_score(c, "random", rng) for _ in range(4000)]
    assert set(np.round(draws, 6)) <= {0.0, 50.0, 100.0}
    # E = 1/2 * (prompt 0: E[s1] = .5, s2 = 0 -> 25) + 1/2 * 100 = 62.5
    assert np.mean(draws) == pytest.approx(62.5, abs=1.5)
    sampled = [M.relation_score(c, "backdoor_sampled", rng, k_prompts=1, k_mentions=1) for _ in range(4000)]
    assert np.mean(sampled) == pytest.approx(62.5, abs=1.5)


def test_unknown_setting_names_the_choices():
    with pytest.raises(ConfigError, match="unknown evaluation setting 'best'; choose from"):
        M.check_setting("best")


def test_consistency_papers_worked_example():
    # model 1 takes rank 3 (position 2) in 800 of 1000 runs -> 80%
    orders = np.array([(0, 2, 1)] * 500 + [(2, 0, 1)] * 300 + [(1, 0, 2)] * 200)
    per_model, overall = M.consistency(orders)
    assert per_model[1] == pytest.approx(80.0)
    assert per_model[0] == pytest.approx(50.0)  # position 0 in 500 runs, position 1 in 500
    assert per_model[2] == pytest.approx(50.0)  # positions 1 / 0 / 2 in 500 / 300 / 200 runs
    assert overall == pytest.approx(50.0)  # the most frequent full ordering: 500 of 1000


def test_bootstrap_orderings_fixed_vs_random_settings():
    rows = []
    rng = np.random.default_rng(0)
    for rel in [f"R{i}" for i in range(6)]:
        for model, acc in (("weak", 0.2), ("strong", 0.8)):
            for p in range(3):
                for s in range(20):
                    rows.append((model, rel, p, f"s{s}", 0, "", bool(rng.random() < acc)))
    cube = M.cubes(table(rows))
    rels = [f"R{i}" for i in range(6)]
    orders = M.bootstrap_orderings(cube, ["weak", "strong"], rels, "backdoor", n_samples=50, subset=3)
    assert orders.shape == (50, 2) and (orders == (0, 1)).all()  # the strong model always ranks above
    again = M.bootstrap_orderings(cube, ["weak", "strong"], rels, "random", n_samples=50, subset=3, seed=7)
    assert (again == M.bootstrap_orderings(cube, ["weak", "strong"], rels, "random", n_samples=50, subset=3,
                                           seed=7)).all()  # seeded
    with pytest.raises(ConfigError, match="subset 7 must be in"):
        M.bootstrap_orderings(cube, ["weak", "strong"], rels, "original", subset=7)


def test_bootstrap_subset_scores_are_means_over_the_drawn_relations():
    # weak beats strong on R0 only, by a margin that wins any draw containing R0
    rows = []
    for rel, (w, s) in {"R0": (1.0, 0.0), "R1": (0.3, 0.4), "R2": (0.3, 0.4)}.items():
        for model, acc in (("weak", w), ("strong", s)):
            for i in range(10):
                rows.append((model, rel, 0, f"s{i}", 0, "", i < 10 * acc))
    cube = M.cubes(table(rows))
    orders = M.bootstrap_orderings(cube, ["weak", "strong"], ["R0", "R1", "R2"], "original", n_samples=300, subset=2)
    # a draw holds R0 with probability 2/3: then weak (mean >= 65) beats strong (<= 40)
    flipped = (orders == (1, 0)).all(axis=1).mean()
    assert flipped == pytest.approx(2 / 3, abs=0.08)


def test_table1_gap_threshold_is_strict():
    spread = M.prompt_spread(p1_frame({("m", "R1"): [40.0, 50.0], ("m", "R2"): [0.0, 10.5]}))
    assert M.table1(spread).iloc[0]["diff_gt10_share"] == pytest.approx(50.0)  # a gap of exactly 10 is not > 10


class _Adapter:
    """The cloze runner's view of a model: ``map`` returns fixed top-k ids; a real tokenizer decodes them."""

    def __init__(self, tok, rows):
        self.tok, self.rows = tok, rows

    def map(self, items, formatter, readout=None, desc=None):
        import torch

        from cprobe.models.adapter import RunOutput

        assert readout.k == len(self.rows[0])
        return RunOutput({}, torch.tensor([[self.tok.convert_tokens_to_ids(t) for t in r] for r in self.rows]))


def test_cloze_runner_skips_stop_words_and_matches_case_insensitively():
    from cprobe.data.items import TextItem
    from cprobe.models.tiny import build_tokenizer
    from cprobe.tasks.prompt_bias import cloze_predictions

    tok = build_tokenizer("bert", ["the", ".", "Paris", "paris", "london", "of"], 32)
    rows = [["the", ".", "Paris"], ["of", "london", "Paris"], ["the", ".", "[SEP]"], ["paris", "the", "."]]
    items = [TextItem(f"R|0|s{i}|0", "x is [Y] .", outcome="Paris", meta={"relation": "R", "prompt": 0,
                                                                            "subject": f"s{i}", "mention": 0})
             for i in range(4)]
    out = cloze_predictions(_Adapter(tok, rows), items, 3, skip_stop_words=True)
    assert out["prediction"].tolist() == ["Paris", "london", "the", "paris"]  # all stop words: the raw top-1
    assert out["correct"].tolist() == [True, False, False, True]
    assert out[["relation", "prompt", "subject", "mention", "gold"]].iloc[1].tolist() == ["R", 0, "s1", 0, "Paris"]
    raw = cloze_predictions(_Adapter(tok, rows), items, 3, skip_stop_words=False)
    assert raw["prediction"].tolist() == ["the", "of", "the", "paris"]
