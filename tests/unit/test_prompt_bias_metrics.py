"""Prompt-bias metrics (Cao et al. 2022) on hand-built prediction tables, every value computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cprobe.errors import ConfigError, DataError
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


def test_stack_pads_relations_prompts_subjects_and_mentions():
    t = pd.concat([cube_table(), table([("m", "Q", 0, "s9", 0, "", True)])], ignore_index=True)
    st = M.stack(t)
    assert st.correct.shape == (1, 2, 2, 2, 2) and st.relations == ("R", "Q")
    assert st.n_prompts.tolist() == [2, 1] and st.n_subjects.tolist() == [2, 1]
    assert st.n_mentions.tolist() == [[2, 1], [1, 0]] and st.scale == 2
    assert st.correct[0, 0, 1].tolist() == [[1, 1], [1, 0]]  # prompt 1: s1 both right; s2 right, no 2nd mention


def test_stack_refuses_models_asked_different_queries():
    t = cube_table()
    other = t.assign(model="n")
    with pytest.raises(DataError, match="not asked the same queries"):
        M.stack(pd.concat([t, other.iloc[:-1]], ignore_index=True))
    with pytest.raises(DataError, match="not asked the same queries"):
        M.stack(pd.concat([t, other.assign(subject="zz")], ignore_index=True))


def test_settings_original_and_backdoor_by_hand():
    st = M.stack(cube_table())
    assert M.relation_scores(st, "original")[0, 0] == pytest.approx(50.0)  # prompt 0, mention 0: s1 right, s2 wrong
    # backdoor: prompt 0 -> subjects (0.5, 0) -> 25; prompt 1 -> (1, 1) -> 100; mean 62.5
    assert M.relation_scores(st, "backdoor")[0, 0] == pytest.approx(62.5)
    # sampling every prompt and mention is the full backdoor average
    every = M.sampled_relation_scores(st, 3, 5, 5, *M.setting_streams(0, "backdoor_sampled"))
    assert np.allclose(every, 62.5)
    with pytest.raises(ConfigError, match="randomised"):
        M.relation_scores(st, "random")


def test_a_prompts_p1_is_rounded_to_two_decimals_before_the_mean_over_prompts():
    # 3 subjects: prompts 0 and 2 get 1 right (33.333...), prompt 1 gets 2 (66.666...): the public code rounds each
    # prompt's P@1 (33.33, 66.67, 33.33) before the mean over prompts: 44.4433, not the unrounded 44.4444
    rows = [("m", "R", p, f"s{s}", 0, "", s < p + 1) for p in range(2) for s in range(3)]
    rows += [("m", "R", 2, f"s{s}", 0, "", s < 1) for s in range(3)]  # prompt 2: 33.33 again
    st = M.stack(table(rows))
    assert M.relation_scores(st, "original")[0, 0] == 33.33
    assert M.relation_scores(st, "backdoor")[0, 0] == pytest.approx((33.33 + 66.67 + 33.33) / 3)  # 44.4433..
    assert M.relation_scores(st, "backdoor")[0, 0] != pytest.approx(100 * 4 / 9)


def test_random_setting_draws_uniformly_over_prompts_and_mentions():
    st = M.stack(cube_table())
    draws = M.sampled_relation_scores(st, 4000, 1, 1, *M.setting_streams(1, "random"))[:, 0, 0]
    assert set(np.round(draws, 6)) <= {0.0, 50.0, 100.0}
    # E = 1/2 * (prompt 0: E[s1] = .5, s2 = 0 -> 25) + 1/2 * 100 = 62.5
    assert np.mean(draws) == pytest.approx(62.5, abs=1.5)
    assert np.mean(draws == 100.0) == pytest.approx(0.5, abs=0.03)  # prompt 1 in half of the draws


def loop_sampled_scores(st, n_draws, k_prompts, k_mentions, prompt_rng, mention_rng):
    """The specification of :func:`M.sampled_relation_scores` as a plain loop over draws, models, relations, prompts
    and subjects, reading the same two streams (and exact fractions, so the 2-decimal rounding agrees)."""
    from fractions import Fraction
    from itertools import combinations

    n_m, n_r, n_p, n_s, n_x = st.correct.shape
    kp = min(k_prompts, n_p)
    out = np.empty((n_draws, n_m, n_r))
    for d in range(n_draws):
        pkeys = prompt_rng.random((n_m, n_r, n_p))
        u = mention_rng.random((n_m, n_r, kp, n_s))
        for m in range(n_m):
            for r in range(n_r):
                prompts = np.argsort(pkeys[m, r, :st.n_prompts[r]], kind="stable")[:k_prompts]
                p1s = []
                for j, p in enumerate(prompts):
                    total = Fraction(0)
                    for s in range(st.n_subjects[r]):
                        subsets = list(combinations(range(st.n_mentions[r, s]), min(k_mentions, st.n_mentions[r, s])))
                        chosen = list(subsets[int(u[m, r, j, s] * len(subsets))])
                        total += Fraction(int(st.correct[m, r, p, s, chosen].sum()), len(chosen))
                    p1s.append(round(float(100 * total / st.n_subjects[r]), 2))
                out[d, m, r] = sum(p1s) / len(p1s)
    return out


def random_table(seed=0, models=("a", "b", "c"), relations=4, prompts=(3, 5, 2, 4), subjects=(4, 6, 3, 5)):
    """A prediction table with uneven prompts, subjects and mentions (1-4) per relation."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(relations):
        mentions = rng.integers(1, 5, subjects[r])
        for model in models:
            for p in range(prompts[r]):
                for s in range(subjects[r]):
                    rows += [(model, f"R{r}", p, f"s{s}", x, "", bool(rng.random() < 0.5)) for x in range(mentions[s])]
    return table(rows)


@pytest.mark.parametrize("k_prompts, k_mentions", [(1, 1), (3, 2), (4, 3)])
def test_vectorised_sampling_equals_the_plain_loop_at_the_same_seed(k_prompts, k_mentions):
    st = M.stack(random_table())
    fast = M.sampled_relation_scores(st, 25, k_prompts, k_mentions, *M.setting_streams(7, "backdoor_sampled"))
    slow = loop_sampled_scores(st, 25, k_prompts, k_mentions, *M.setting_streams(7, "backdoor_sampled"))
    np.testing.assert_array_equal(fast, slow)
    # chunking the draws (a small memory budget) reads the streams in the same order
    old = M._BUDGET
    try:
        M._BUDGET = 1
        np.testing.assert_array_equal(
            M.sampled_relation_scores(st, 25, k_prompts, k_mentions, *M.setting_streams(7, "backdoor_sampled")), fast)
    finally:
        M._BUDGET = old


def test_popcount_with_and_without_numpys_bitwise_count(monkeypatch):
    x = np.array([[0b1011, 0], [0b1111, 0b10000]], dtype=np.uint8)
    assert M._popcount(x, 5).tolist() == [[3, 0], [4, 1]]
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert M._popcount(x, 5).tolist() == [[3, 0], [4, 1]]


def test_mention_subsets_are_every_k_subset_in_lexicographic_order():
    masks, offset, count = M._subset_masks(4, 2)
    assert count.tolist() == [1, 1, 1, 3, 6] and masks[offset[0]] == 0
    assert masks[offset[1]] == 0b1 and masks[offset[2]] == 0b11  # fewer mentions than k: all of them
    assert masks[offset[3]:offset[3] + 3].tolist() == [0b011, 0b101, 0b110]
    assert masks[offset[4]:offset[4] + 6].tolist() == [0b0011, 0b0101, 0b1001, 0b0110, 0b1010, 0b1100]


def test_relation_draws_are_without_replacement_and_seeded():
    picks = M.draw_subsets(6, 4, 500, seed=3)
    assert picks.shape == (500, 4) and all(len(set(row)) == 4 for row in picks.tolist())
    assert (picks == M.draw_subsets(6, 4, 500, seed=3)).all() and not (picks == M.draw_subsets(6, 4, 500, 4)).all()
    counts = np.bincount(picks.ravel(), minlength=6) / picks.size
    assert np.allclose(counts, 1 / 6, atol=0.02)  # every relation as likely
    with pytest.raises(ConfigError, match="subset 7 must be in"):
        M.draw_subsets(6, 7, 10, 0)


def two_models_four_relations():
    """weak beats strong on R0 only, by a margin that wins any draw holding R0 — so the order depends on the draw."""
    rows = []
    for rel, (w, s) in {"R0": (1.0, 0.0), "R1": (0.3, 0.4), "R2": (0.3, 0.4), "R3": (0.3, 0.4)}.items():
        for model, acc in (("weak", w), ("strong", s)):
            for p in range(2):
                for i in range(10):
                    rows.append((model, rel, p, f"s{i}", 0, "", i < 10 * (acc if p == 0 else 1 - acc)))
    return M.stack(table(rows), ["weak", "strong"])


def test_every_relation_drawn_gives_one_ordering_under_a_fixed_setting():
    # drawing all 4 relations without replacement is the same set every time: one ordering. With replacement, the
    # draws would differ (R0 twice, or missing) and so would the order.
    st = two_models_four_relations()
    orders = M.bootstrap_orderings(st, "original", n_samples=300, subset=4)
    assert len({tuple(o) for o in orders.tolist()}) == 1


def test_random_is_redrawn_for_every_draw():
    # every draw holds all 4 relations; only the random prompt moves the order (prompt 1 reverses the accuracies).
    # A random prompt drawn once would give a single ordering in all 300 draws.
    st = two_models_four_relations()
    orders = M.bootstrap_orderings(st, "random", n_samples=300, subset=4, seed=5)
    share = (orders == (1, 0)).all(axis=1).mean()  # strong ranks below weak
    assert 0.2 < share < 0.8
    sampled = M.bootstrap_orderings(st, "backdoor_sampled", n_samples=300, subset=4, seed=5, k_prompts=1)
    assert len({tuple(o) for o in sampled.tolist()}) == 2


def test_bootstrap_subset_scores_are_means_over_the_drawn_relations():
    st = two_models_four_relations()
    orders = M.bootstrap_orderings(st, "original", n_samples=400, subset=2)
    # a draw of 2 of 4 relations holds R0 with probability 1/2: then weak (mean 65) beats strong (40)
    flipped = (orders == (1, 0)).all(axis=1).mean()
    assert flipped == pytest.approx(1 / 2, abs=0.08)
    picks = M.draw_subsets(4, 2, 400, 42)
    scores = M.bootstrap_scores(st, "original", picks)
    expected = M.relation_scores(st, "original")[:, picks].mean(-1).T  # (draws, models)
    np.testing.assert_allclose(scores, np.round(expected, 2))


def test_a_draws_mean_is_rounded_to_two_decimals_before_ordering():
    # model a (listed first) is 0.0033 points better on average than b (10.01, 10, 10 vs 10, 10, 10): equal after
    # rounding, so the stable order keeps a first (worst), as the public code; unrounded, a would rank above b.
    rows = []
    for model, hits in (("a", [1001, 1000, 1000]), ("b", [1000, 1000, 1000])):  # relation R{j}: hits of 10,000
        for j, h in enumerate(hits):
            rows += [(model, f"R{j}", 0, f"s{i}", 0, "", i < h) for i in range(10_000)]
    st = M.stack(table(rows))
    raw = M.relation_scores(st, "original")
    assert raw[0].mean() > raw[1].mean()
    scores = M.bootstrap_scores(st, "original", M.draw_subsets(3, 3, 5, 0))
    assert (scores == 10.0).all()
    assert (M.orderings(scores) == (0, 1)).all()  # tie: the models' order
    _, any_tie = M.ties(scores)
    assert any_tie == 100.0


def test_ordering_rounds_to_two_decimals_and_breaks_ties_stably():
    assert M.ordering([3.0, 1.0, 2.0]) == (1, 2, 0)  # worst to best
    assert M.ordering([1.004, 1.001]) == (0, 1)  # equal after rounding: index order
    assert M.ordering([1.004, 1.001], decimals=None) == (1, 0)


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


def test_know_nothing_models_tied_at_zero_are_reported_as_ties():
    # x and y know nothing (0 in every draw): "100% consistent" only because the tie keeps their order
    scores = np.array([[0.0, 0.0, 40.0, 40.5], [0.0, 0.0, 41.0, 40.5], [0.0, 0.0, 40.0, 40.5], [0.0, 0.0, 40.0, 40.0]])
    per_model, overall = M.consistency(M.orderings(scores))
    assert per_model[:2].tolist() == [100.0, 100.0] and overall == 75.0  # (x, y, p, q) in draws 1, 3 and 4
    tied, any_tie = M.ties(scores)
    assert tied.tolist() == [100.0, 100.0, 25.0, 25.0] and any_tie == 100.0
    pairs = M.pair_stats(scores, ["x", "y", "p", "q"])
    first = pairs.iloc[0]
    assert (first["model_a"], first["model_b"], first["gap"], first["tied"]) == ("x", "y", 0.0, 100.0)
    pq = pairs[(pairs["model_a"] == "p") & (pairs["model_b"] == "q")].iloc[0]
    # q - p: 0.5, -0.5, 0.5, 0 -> mean 0.125; p ranks below q (p <= q) in draws 1, 3, 4: the minority order 1 of 4
    assert pq["gap"] == pytest.approx(0.125) and pq["tied"] == 25.0 and pq["flips"] == 25.0
    assert pairs.index[pairs["model_a"].eq("p") & pairs["model_b"].eq("q")][0] == 1  # second closest, after (x, y)


def test_rank_instability_over_every_k_model_subset():
    # 3 models, 2 prompts on one relation: a < b < c, then b < a < c. Pairs: (a, b) flips, (a, c), (b, c) do not.
    p = p1_frame({("a", "R1"): [10.0, 30.0], ("b", "R1"): [20.0, 20.0], ("c", "R1"): [50.0, 50.0]})
    assert M.rank_instability(p) == 100.0
    value, n = M.rank_instability_k(p, 2)
    assert n == 3 and value == pytest.approx(100 / 3)
    assert M.rank_instability_k(p, 3) == (100.0, 1)
    assert M.rank_instability(p, ["a", "c"]) == 0.0
    with pytest.raises(ConfigError, match="at least 2"):
        M.rank_instability_k(p, 1)


def test_rank_instability_rounds_prompt_p1_to_two_decimals():
    # a and b differ by 0.001 under prompt 0 (a tie after rounding: a first) and by 1 the other way under prompt 1
    p = p1_frame({("a", "R1"): [20.001, 20.0], ("b", "R1"): [20.0, 21.0], ("c", "R1"): [90.0, 90.0]})
    assert M.rank_instability(p) == 0.0  # both prompts: a below b below c
    assert M.rank_instability_k(p, 2) == (0.0, 3)


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


def test_cloze_runner_reads_top_k_tokens_and_flags_non_words():
    from cprobe.data.items import TextItem
    from cprobe.models.tiny import build_tokenizer
    from cprobe.tasks.prompt_bias import cloze_predictions

    tok = build_tokenizer("bert", ["the", ".", "Paris", "paris", "london", "of"], 32)
    rows = [["the", ".", "Paris"], ["of", "london", "Paris"], ["the", ".", "[SEP]"], ["paris", "the", "."]]
    items = [TextItem(f"R|0|s{i}|0", "x is [Y] .", outcome="Paris", meta={"relation": "R", "prompt": 0,
                                                                            "subject": f"s{i}", "mention": 0})
             for i in range(4)]
    out = cloze_predictions(_Adapter(tok, rows), items, 3)
    assert out["top"].tolist() == rows
    assert out["non_word"].tolist()[2] == [False, True, True]  # "." and [SEP]
    assert out[["relation", "prompt", "subject", "mention", "gold"]].iloc[1].tolist() == ["R", 0, "s1", 0, "Paris"]


def choose(rows, gold, **kw):
    from cprobe.tasks.prompt_bias import Config, choose_predictions

    non_word = [[not any(c.isalnum() for c in t) or t.startswith("[") for t in r] for r in rows]
    frame = pd.DataFrame({"gold": gold, "top": rows, "non_word": non_word})
    return choose_predictions(frame, Config(**kw))


def test_predictions_follow_the_public_code_by_default():
    rows = [["the", ".", "Paris"],  # a stop word skipped; "." is not a stop word in the public code
            ["The", "paris", "x"],  # "The" is not in the (lower-case, exact-match) list; "paris" != "Paris"
            ["the", "of", "a"],  # all stop words: the last of them (the public code's loop), not the top-1
            ["system", "us", "fire"],  # possible LAMA objects: not stop words here
            ["us", "it", "Paris"]]
    out = choose(rows, ["Paris", "paris", "a", "us", "us"])
    assert out["prediction"].tolist() == [".", "The", "a", "system", "us"]
    assert out["correct"].tolist() == [False, False, True, False, True]


def test_prediction_options_sklearn_stop_words_non_words_and_case():
    rows = [["the", ".", "Paris"], ["The", "paris", "x"], ["system", "us", "fire"], ["the", "of", "a"]]
    gold = ["Paris", "Paris", "system", "a"]
    out = choose(rows, gold, stop_words="sklearn", skip_non_words=True, case_sensitive=False)
    # sklearn's list is matched in any case and holds 'system', 'us', 'fire': none of them can be predicted
    assert out["prediction"].tolist() == ["Paris", "paris", "fire", "a"]
    assert out["correct"].tolist() == [True, True, False, True]
    assert choose(rows, gold, skip_non_words=True)["prediction"].tolist()[0] == "Paris"
    assert choose([["PARIS"]], ["Paris"], case_sensitive=False)["correct"].tolist() == [True]
    assert choose([["PARIS"]], ["Paris"])["correct"].tolist() == [False]
    assert choose(rows, gold, skip_stop_words=False)["prediction"].tolist() == ["the", "The", "system", "the"]


def test_the_reference_stop_word_list():
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    from cprobe.tasks.prompt_bias import REFERENCE_STOP_WORDS, stop_words

    assert len(REFERENCE_STOP_WORDS) == 162 and {"the", "of", "wouldn", "n't", "``"} <= REFERENCE_STOP_WORDS
    assert not {"system", "fire", "us", "The"} & REFERENCE_STOP_WORDS
    assert {"system", "fire", "us"} <= ENGLISH_STOP_WORDS and len(ENGLISH_STOP_WORDS) == 318
    assert stop_words("reference") == (REFERENCE_STOP_WORDS, True)
    with pytest.raises(ConfigError, match="unknown stop-word list"):
        stop_words("nltk")
