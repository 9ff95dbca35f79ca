"""AxBench's SAE methods against the reference's definitions (issue 52 item 4; ``axbench/models/sae.py`` and
``axbench/models/mean.py`` of stanfordnlp/axbench, re-implemented): the latent selection rules and the AUROC on a
hand-made 4-latent SAE over 6 texts, computed here by hand; the concept score as the latent's activation (not a
projection) through the AxBench study's scoring; SAE-DiffMean's direction; bad settings in one line."""

from __future__ import annotations

import pytest
import torch

from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError
from cprobe.metrics.detection import auroc, auroc_columns
from cprobe.sae import select
from cprobe.sae.dictionary import SAE
from cprobe.sae.quality import held_out
from tests.unit.test_sae import write_folder

# Six texts of token states; the hand SAE's latent j is relu(x_j), so a row is its own latents.
# Latent 0 fires hugely on one positive text, latent 1 a little on every positive text, latent 2 ties, latent 3 fires
# on the negatives only.
TEXTS = {  # text: (label, [[latent 0, 1, 2, 3] per token])
    "P1": (1, [[10, 1.0, 1, 0], [0, 0.0, 1, 0]]),
    "P2": (1, [[0, 2.0, 1, 0], [0, 0.0, 0, 0]]),
    "P3": (1, [[0, 0.0, 0, 0], [0, 1.5, 0, 0]]),
    "N1": (0, [[0, 0.5, 1, 2], [0, 0.0, 1, 2]]),
    "N2": (0, [[1, 0.0, 0, 3], [0, 1.5, 0, 1]]),
    "N3": (0, [[0, 0.5, 0, 0], [0, 0.5, 0, 4], [0, 0.5, 0, 2]]),  # three tokens: a text's mean is not a token mean
}
# By hand, per latent (3 × 3 = 9 positive-negative pairs; a tie counts one half):
# - text maxima (auroc rule). Latent 0: P 10, 0, 0 / N 0, 1, 0 → P1 wins 3, P2 and P3 tie twice and lose once
#   (1 each): 5/9. Latent 1: P 1, 2, 1.5 / N 0.5, 1.5, 0.5 → P1 2, P2 3, P3 2 + ½: 7.5/9 = 5/6. Latent 2: P 1, 1, 0 /
#   N 1, 0, 0 → P1 2½, P2 2½, P3 1: 6/9 = 2/3. Latent 3: every negative above every positive: 0.
AUROCS = [5 / 9, 5 / 6, 2 / 3, 0.0]
# - text means (mean_diff rule). Latent 0: P 5, 0, 0 → 5/3; N 0, 0.5, 0 → 1/6; 5/3 − 1/6 = 3/2 (a token mean would
#   give 5/3 − 1/7). Latent 1: P 0.5, 1, 0.75 → 0.75; N 0.25, 0.75, 0.5 → 0.5; 1/4. Latent 2: P 1, 0.5, 0 → 1/2;
#   N 1, 0, 0 → 1/3; 1/6. Latent 3: P 0; N 2, 2, 2 → −2.
MEAN_DIFFS = [1.5, 0.25, 1 / 6, -2.0]
# AxBench keeps the highest score, signed: latent 1 by AUROC, latent 0 by mean difference. A rule on |AUROC − ½| or
# on |difference| would pick latent 3 (0.5 > 1/3, 2 > 1.5); the two rules disagree, so a swap of them shows too.


def hand_texts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X (n_tokens, 4), y (n_tokens,) each token's text label, texts (n_tokens,) text ids)."""
    X, y, t = [], [], []
    for i, (label, rows) in enumerate(TEXTS.values()):
        X += rows
        y += [label] * len(rows)
        t += [i] * len(rows)
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y), torch.tensor(t)


def identity_sae(**kw) -> SAE:
    """4 latents, ReLU, latent j = relu(x_j), decoder rows e_j scaled by j + 1 (so ``a`` is read as a unit row)."""
    args = dict(W_enc=torch.eye(4), b_enc=torch.zeros(4), W_dec=torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0])),
                b_dec=torch.zeros(4), activation="relu")
    return SAE(**{**args, **kw})


# ------------------------------------------------------------------------------------ the reference's rules
def test_auroc_rule_scores_each_latent_by_the_auroc_of_text_maxima():
    X, y, t = hand_texts()
    got = select.text_scores("auroc", identity_sae(), X, y, t)
    assert got.tolist() == pytest.approx(AUROCS, abs=1e-12)
    assert int(select.top(got, 1)[0]) == 1


def test_mean_diff_rule_scores_each_latent_by_the_difference_of_text_means():
    X, y, t = hand_texts()
    got = select.text_scores("mean_diff", identity_sae(), X, y, t)
    assert got.tolist() == pytest.approx(MEAN_DIFFS, abs=1e-12)
    assert int(select.top(got, 1)[0]) == 0


def test_auroc_with_ties_counts_a_tie_one_half():
    maxima = torch.tensor([[10.0, 1.0, 1.0, 0.0], [0, 2, 1, 0], [0, 1.5, 0, 0], [0, 0.5, 1, 2], [1, 1.5, 0, 3],
                           [0, 0.5, 0, 4]])
    labels = torch.tensor([1, 1, 1, 0, 0, 0])
    assert auroc_columns(maxima, labels).tolist() == pytest.approx(AUROCS, abs=1e-12)
    for j, want in enumerate(AUROCS):  # the one-column form agrees
        assert auroc(maxima[:, j], labels) == pytest.approx(want, abs=1e-12)
    assert auroc(torch.ones(6), labels) == 0.5  # every pair tied: AxBench's min-max normalised NaN → 0, also ½


def test_the_direction_method_selects_by_the_rule_and_scores_by_the_latent(tmp_path):
    X, y, t = hand_texts()
    write_folder(tmp_path / "sae", identity_sae())
    by_auroc = DIRECTIONS.build({"name": "sae_axbench", "path": str(tmp_path / "sae")}, seed=0).fit(X, y, texts=t)
    assert by_auroc.latent_ == 1 and torch.equal(by_auroc.a, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    by_diff = DIRECTIONS.build({"name": "sae_axbench", "path": str(tmp_path / "sae"), "select": "mean_diff"},
                               seed=0).fit(X, y, texts=t)
    assert by_diff.latent_ == 0 and torch.equal(by_diff.a, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # the concept score is the latent's activation: relu, not the projection on a
    probe = torch.tensor([[0.0, -3.0, 0.0, 0.0], [0.0, 2.5, 9.0, 0.0]])
    assert by_auroc.token_scores(probe).tolist() == [0.0, 2.5]
    # without texts every token is a text of its own: the token-level means, another score
    alone = DIRECTIONS.build({"name": "sae_axbench", "path": str(tmp_path / "sae"), "select": "mean_diff"},
                             seed=0).fit(X, y)
    assert alone.scores_[0].item() == pytest.approx(10 / 6 - 1 / 7)  # token means: 10 over 6, 1 over 7


def test_jumprelu_activation_as_gemma_scope_computes_it():
    """Gemma Scope's JumpReLU (AxBench's JumpReLUSAECollectIntervention): pre = x W_enc + b_enc (no b_dec subtracted),
    kept where above the latent's threshold."""
    sae = identity_sae(activation="jumprelu", threshold=torch.tensor([0.0, 1.0, 0.0, 0.0]),
                       b_enc=torch.tensor([0.0, 0.5, 0.0, 0.0]), b_dec=torch.full((4,), 7.0),
                       apply_b_dec_to_input=False)
    x = torch.tensor([[0.0, 0.4, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.6, 0.0, 0.0], [0.0, -2.0, 0.0, 0.0]])
    # pre = x₁ + 0.5 = 0.9, 1.0, 1.1, −1.5; above the threshold 1.0 only the third (1.0 is not above it)
    assert sae.latent(x, 1).tolist() == pytest.approx([0.0, 0.0, 1.1, 0.0])
    assert torch.equal(sae.latent(x, 1), sae.encode(x)[:, 1])
    topk = identity_sae(activation="topk", k=1)  # TopK: a latent counts only among a row's k largest
    assert topk.latent(torch.tensor([[0.0, 2.0, 3.0, 0.0], [0.0, 2.0, 1.0, 0.0]]), 1).tolist() == [0.0, 2.0]


def test_sae_diffmean_decodes_the_latents_mean_difference(tmp_path):
    """GemmaScopeSAEDiffMean: δ = the text means' class difference (every latent), a ∝ δ W_dec."""
    X, y, t = hand_texts()
    write_folder(tmp_path / "sae", identity_sae())
    m = DIRECTIONS.build({"name": "sae_diffmean", "path": str(tmp_path / "sae")}, seed=0).fit(X, y, texts=t)
    assert m.delta_.tolist() == pytest.approx(MEAN_DIFFS, abs=1e-12)
    want = torch.tensor([1.5 * 1, 0.25 * 2, (1 / 6) * 3, -2.0 * 4])
    torch.testing.assert_close(m.a, want / want.norm())


# ------------------------------------------------------------------------------------ through the study's scoring
def test_the_axbench_study_scores_the_latents_activation_not_a_projection(tmp_path):
    """Held-out texts where the activation (relu(x₁ − 1)) and the projection on the decoder row (x₁) rank differently:
    max-pooled positives 1.5 and 0.95 against negatives 0.9 and 0.2 give the projection AUROC 1, the activation
    0.5 and 0 against 0 and 0: 3/4."""
    from cprobe.tasks.axbench import Config, score_concept

    write_folder(tmp_path / "sae", identity_sae(b_enc=torch.tensor([0.0, -1.0, 0.0, 0.0])))
    train = [(1, [[0, 3.0, 0, 0]]), (1, [[0, 2.5, 0, 0]]), (0, [[0, 0.5, 0, 0]]), (0, [[0, 0.0, 0, 0]])]
    test = [(1, [[0, 1.5, 0, 0], [0, 0.1, 0, 0]]), (1, [[0, 0.95, 0, 0], [0, 0.0, 0, 0]]),
            (0, [[0, 0.9, 0, 0], [0, 0.3, 0, 0]]), (0, [[0, 0.2, 0, 0], [0, 0.0, 0, 0]])]
    texts = train + test
    T = max(len(r) for _, r in texts)
    H = torch.zeros(len(texts), T, 4)
    mask = torch.zeros(len(texts), T, dtype=torch.bool)
    for i, (_, rows) in enumerate(texts):
        H[i, :len(rows)] = torch.tensor(rows)
        mask[i, :len(rows)] = True
    y = torch.tensor([lab for lab, _ in texts])
    cfg = Config(methods=["sae_axbench", "sae_decoder"], poolings=["max"],
                 params={m: {"path": str(tmp_path / "sae")} for m in ("sae_axbench", "sae_decoder")})
    rows = {r["method"]: r for r in score_concept({3: H}, mask, y, torch.arange(4), torch.arange(4, 8), cfg, 0)}
    assert rows["sae_axbench"]["auroc"] == pytest.approx(0.75)
    assert rows["sae_decoder"]["auroc"] == pytest.approx(1.0)  # the same latent's decoder row, as a projection
    for r in rows.values():  # the SAE's quality on the 8 held-out tokens
        assert r["sae_n"] == 8 and r["sae_dead_fraction"] == pytest.approx(0.75)  # only latent 1 fires


def test_quality_is_measured_on_the_states_given_and_nothing_without_an_sae():
    sae = identity_sae()
    X = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -1.0]])

    class Fitted:
        sae_ = sae

    q = held_out(Fitted(), X)
    # x̂ = relu(x) diag(1..4): [1, 0, 0, 0] and 0; Σ‖x − x̂‖² = 1; x̄ = [½, 0, 0, −½], Σ‖x − x̄‖² = 1: FVU 1
    assert q == {"sae_fvu": pytest.approx(1.0), "sae_l0": 0.5, "sae_dead_fraction": 0.75, "sae_n": 2}
    assert held_out(object(), X) == {}


# ------------------------------------------------------------------------------------ bad settings
@pytest.mark.parametrize(("params", "needle"), [
    ({"name": "sae_axbench", "select": "probe"}, "unknown SAE select 'probe'; choose from ['auroc', 'mean_diff']"),
    ({"name": "sae_axbench", "latents": 2}, "reads one latent, as AxBench does"),
    ({"name": "sae_diffmean", "select": "auroc"}, "takes no select"),
    ({"name": "sae"}, "unknown direction method 'sae'; did you mean 'sae_axbench', 'sae_decoder', 'sae_diffmean', "
                       "'sae_features'?"),
])
def test_bad_settings_are_one_line(params, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("?", r"\?").replace("(", r"\(")):
        DIRECTIONS.build(params, seed=0)


def test_a_loaded_sae_of_another_width_is_refused_before_states_are_read(tmp_path):
    write_folder(tmp_path / "sae", identity_sae())
    m = DIRECTIONS.build({"name": "sae_axbench", "path": str(tmp_path / "sae")}, seed=0)
    m.check_states(4)
    with pytest.raises(ConfigError, match="reads states of width 4, but the states here have width 8"):
        m.check_states(8)


def test_text_ids_default_to_a_text_per_row_and_must_match_the_rows():
    from cprobe.sae.select import text_ids

    y = torch.tensor([0, 1, 1])
    assert text_ids(y, None).tolist() == [0, 1, 2]
    assert text_ids(y, torch.tensor([0, 0, 1])).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match=r"expected one text id per row, got \(2,\) for 3 rows"):
        text_ids(y, torch.tensor([0, 1]))
