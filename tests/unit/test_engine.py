"""The engine under ModelAdapter.map and extraction: vectorised positions against the per-item reference, the batch
planner, prefetching, the CUDA OOM back-off (injected on CPU), sharded cache writes, resume, streaming fits."""

from __future__ import annotations

import bisect
import threading

import pytest
import torch

from cprobe.cache import ActivationCache
from cprobe.data.base import Example
from cprobe.data.grammar import GrammarConfig, generate
from cprobe.data.items import TextItem
from cprobe.errors import ConfigError
from cprobe.extract import Activations, extract_sites, fit_streaming
from cprobe.interventions.leace import LEACE
from cprobe.interventions.mean_diff import MeanDiff
from cprobe.models import batching
from cprobe.models.adapter import ModelAdapter
from cprobe.models.batching import BatchLimits, Encoded, Prefetcher, last_tokens, plan_batches, span_tensors
from cprobe.models.formatters import AgreementFormatter, ClozeFormatter, RegionFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from cprobe.probes.linear import LinearProbe
from cprobe.probes.mlp import MLPProbe
from tests.conftest import WORDS, make_random_model, write_activations


# ----------------------------------------------------------------------------------------------- references
def reference_last_tokens(offsets, mask, spans):
    """The per-item loop the engine replaced (formatters._last_tokens before vectorising)."""
    starts = [s for s, _ in spans]
    out = {}
    for t in range(len(offsets)):
        s, e = offsets[t].tolist()
        if not mask[t] or e <= s:
            continue
        i = bisect.bisect_right(starts, e - 1) - 1
        if i >= 0 and s < spans[i][1]:
            out[i] = t
    return out


def reference_encode_regions(tokenizer, regions, bos):
    starts, at = [], 0
    for region in regions:
        starts.append(at)
        at += len(region)
    enc = tokenizer("".join(regions), add_special_tokens=False, return_offsets_mapping=True)
    last = [-1] * len(regions)
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s:
            last[bisect.bisect_right(starts, e - 1) - 1] = t + len(bos)
    return bos + list(enc["input_ids"]), last


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_positions_equal_the_per_item_loop_on_random_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    n, T = 40, 18
    offsets = torch.zeros(n, T, 2, dtype=torch.long)
    mask = torch.zeros(n, T, dtype=torch.long)
    spans = []
    for i in range(n):
        length = int(torch.randint(0, T + 1, (1,), generator=g))
        mask[i, :length] = 1
        at = 0
        for t in range(length):  # tokens with gaps, specials (empty offsets) and multi-char pieces
            if torch.rand(1, generator=g) < 0.15:
                continue  # (0, 0): a special token
            at += int(torch.randint(0, 3, (1,), generator=g))
            w = int(torch.randint(1, 4, (1,), generator=g))
            offsets[i, t] = torch.tensor([at, at + w])
            at += w
        k = int(torch.randint(0, 6, (1,), generator=g))
        cuts = sorted(torch.randint(0, max(at, 1) + 3, (2 * k,), generator=g).tolist())
        row = [(cuts[2 * j], cuts[2 * j + 1]) for j in range(k) if cuts[2 * j] < cuts[2 * j + 1]]
        row = [sp for j, sp in enumerate(row) if j == 0 or sp[0] >= row[j - 1][1]]  # disjoint
        spans.append(row)
    starts, ends, _ = span_tensors(spans)
    got = last_tokens(offsets, mask, starts, ends)
    for i in range(n):
        ref = reference_last_tokens(offsets[i], mask[i], spans[i])
        want = [ref.get(j, -1) for j in range(len(spans[i]))]
        assert got[i, : len(spans[i])].tolist() == want, (i, spans[i])
        assert (got[i, len(spans[i]):] == -1).all()


def _adapter(arch="bert", **kw):
    model, tok = make_random_model(arch)
    return ModelAdapter(model, tok, "mlm" if arch == "bert" else "causal", arch, **kw)


def _examples(n=60, seed=0):
    vocab = set(WORDS)
    ex = [e for e in generate(GrammarConfig(n_sentences=4 * n, seed=seed)).examples if set(e.words) <= vocab]
    if len(ex) < n:  # the grammar's words mostly miss the test vocabulary: build sentences from it instead
        g = torch.Generator().manual_seed(seed)
        nouns, fill = ["author", "authors", "guard", "guards"], [f"w{i}" for i in range(20)]
        for i in range(n - len(ex)):
            k = int(torch.randint(0, 6, (1,), generator=g))
            middle = [fill[int(j)] for j in torch.randint(0, 20, (k,), generator=g)]
            words = ["the", nouns[i % 4], *middle, "is", "here"]
            ex.append(Example(f"x{i}", tuple(words), len(words) - 2, "is", "are"))
    return ex[:n]


def test_region_positions_equal_the_per_item_encoder():
    items = [TextItem(str(i), "".join(r), regions=r) for i, r in enumerate([
        ("the author", " near the guards", " is", " here"), ("the", "", " guards", " are"), ("w1 w2",),
        ("", "the author", " is")])]
    for bos in (False, True):
        ad = _adapter("gpt_neox", bos="auto" if bos else "none")
        b = RegionFormatter()(items, ad, torch.arange(len(items)))
        for i, it in enumerate(items):
            ids, last = reference_encode_regions(ad.tok, it.regions, [ad.tok.bos_token_id] if bos else [])
            assert b.input_ids[i, : len(ids)].tolist() == ids and int(b.attention_mask[i].sum()) == len(ids)
            assert [int(b.positions[f"region:{r}"][i]) for r in range(len(it.regions))] == last
            assert int(b.positions["last"][i]) == len(ids) - 1


def test_cloze_subject_position_is_the_mentions_last_token():
    ad = _adapter("bert")
    items = [TextItem("a", "the author near the guards [Y] here", slots={"subject": "the guards"}),
             TextItem("b", "w1 w2 [Y] .", slots={"subject": "nowhere"})]
    b = ClozeFormatter()(items, ad, torch.arange(2))
    # [CLS] the author near the guards: the mention "the guards" ends at token 5
    assert int(b.positions["subject"][0]) == 5 and int(b.positions["subject"][1]) == -1
    assert int(b.positions["object"][0]) == 6


def test_word_and_region_spans_by_hand():
    from cprobe.models.formatters import _spans

    assert _spans(["the", "dogs", "run"], 1) == [(0, 3), (4, 8), (9, 12)]  # words joined by one space
    assert _spans(("ab", "", "c"), 0) == [(0, 2), (2, 2), (2, 3)]  # regions tile the text; an empty one is empty
    assert _spans([], 1) == []


def test_token_lengths_keep_the_newest_lists_only():
    from cprobe.models.adapter import _LENGTH_LISTS

    ad = _adapter("bert")
    lists = [[WORDS[i]] * (i + 1) for i in range(_LENGTH_LISTS + 2)]
    for texts in lists:
        assert ad.token_lengths(texts) == [3] * len(texts)  # [CLS] word [SEP]
    kept = [list(k[1]) for k in ad._memo if k[0] == "lengths"]
    assert kept == lists[-_LENGTH_LISTS:]


# ----------------------------------------------------------------------------------------------- planning
def test_the_planner_respects_rows_and_token_budget_and_covers_every_row_once():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 50, (500,), generator=g)
    for bs, budget in ((16, None), (64, 300), (1000, 1000), (8, 10)):
        plan = plan_batches(lengths, bs, budget)
        rows = torch.cat(plan)
        assert sorted(rows.tolist()) == list(range(500))
        widths = [int(lengths[b].max()) for b in plan]
        assert widths == sorted(widths, reverse=True)  # longest first
        for b, w in zip(plan, widths):
            assert len(b) <= bs
            if budget is not None:
                assert len(b) * w <= budget or len(b) == 1


def test_encoded_batches_pad_and_trim_like_the_tokenizer():
    ad = _adapter("bert")
    ex = _examples(20)
    fmt = AgreementFormatter(("target", "first", "word:1"))
    enc = fmt.encode(ex, ad)
    idx = torch.tensor([3, 0, 7])
    b = enc.batch(idx)
    direct = fmt([ex[i] for i in idx.tolist()], ad, idx)
    assert torch.equal(b.input_ids, direct.input_ids) and torch.equal(b.attention_mask, direct.attention_mask)
    assert all(torch.equal(b.positions[k], direct.positions[k]) for k in b.positions)
    whole = ad.tok([" ".join(AgreementFormatter.words(e, ad)[0]) for e in ex], padding=True, return_tensors="pt")
    assert torch.equal(enc.batch(torch.arange(20)).input_ids, whole["input_ids"])
    assert isinstance(Encoded.cat([enc, enc]), Encoded) and len(Encoded.cat([enc, enc])) == 40


@pytest.mark.numeric
@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_token_budget_batches_give_the_same_states_in_input_order(arch):
    ex = _examples(50)
    sites = [Site(1), Site(3)]
    base = _adapter(arch, batch_size=50).map(ex, AgreementFormatter(), read=sites)
    budget = _adapter(arch, batch_size=64, batch_tokens=40).map(ex, AgreementFormatter(), read=sites)
    for s in sites:
        torch.testing.assert_close(budget.acts[s], base.acts[s], atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_prefetching_on_a_thread_changes_nothing_and_stops_cleanly():
    ex = _examples(40)
    ad = _adapter("gpt2", batch_size=6)
    cands = CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong)] for e in ex])
    plain = ad.map(ex, AgreementFormatter(), read=[Site(2)], readout=cands)
    ad.prefetch = True
    threaded = ad.map(ex, AgreementFormatter(), read=[Site(2)], readout=cands)
    assert torch.equal(plain.acts[Site(2)], threaded.acts[Site(2)]) and torch.equal(plain.scores, threaded.scores)
    it = iter(ad.stream(ex, AgreementFormatter(), [Site(2)]))
    next(it)
    it.close()  # leaving early stops the producer
    assert not any(t.name == "cprobe-prefetch" and t.is_alive() for t in threading.enumerate())


def test_prefetcher_reraises_the_producers_error():
    def source():
        yield 0, None
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(Prefetcher(source()))


def test_bf16_storage_halves_memory_and_stays_close():
    ex = _examples(20)
    ad = _adapter("bert")
    f32 = ad.map(ex, AgreementFormatter(), read=[Site(2)])
    b16 = ad.map(ex, AgreementFormatter(), read=[Site(2)], dtype=torch.bfloat16)
    assert b16.acts[Site(2)].dtype == torch.bfloat16
    torch.testing.assert_close(b16.acts[Site(2)].float(), f32.acts[Site(2)], atol=2e-2, rtol=1e-2)


# ----------------------------------------------------------------------------------------------- OOM back-off
def _inject_oom(ad, max_tokens, calls):
    real = ad.run

    def run(batch, *a, **k):
        tokens = batch.input_ids.shape[0] * batch.input_ids.shape[1]
        calls.append(tokens)
        if tokens > max_tokens:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return real(batch, *a, **k)
    ad.run = run


def test_oom_halves_the_batch_remembers_the_size_and_persists_it(tmp_path):
    batching._LIMITS.clear()
    ex = _examples(48)
    ref = _adapter("bert", batch_size=48).map(ex, AgreementFormatter(), read=[Site(2)])
    path = tmp_path / "engine" / "batch_limits.json"
    ad, calls = _adapter("bert", batch_size=48, limits=BatchLimits(path)), []
    _inject_oom(ad, 100, calls)
    out = ad.map(ex, AgreementFormatter(), read=[Site(2)])
    torch.testing.assert_close(out.acts[Site(2)], ref.acts[Site(2)], atol=1e-5, rtol=1e-5)
    assert calls[0] > 100 and max(calls[1:]) <= calls[0] // 2 + calls[0] % 2
    learnt = ad.token_cap()
    assert learnt is not None and learnt <= 100 and path.is_file()
    batching._LIMITS.clear()  # a new process of the sweep: the limit comes from the cache file
    fresh, calls2 = _adapter("bert", batch_size=48, limits=BatchLimits(path)), []
    _inject_oom(fresh, 100, calls2)
    fresh.map(ex, AgreementFormatter(), read=[Site(2)])
    assert max(calls2) <= learnt  # no failed attempt: it starts at the size that fits
    batching._LIMITS.clear()


def test_the_edited_pass_halves_a_chunk_on_oom_and_scores_every_row_once():
    from cprobe.models.edits import Replace
    from cprobe.models.multisite import edited_pass

    batching._LIMITS.clear()
    ex, fmt = _examples(24), AgreementFormatter()

    def edited(ad):
        batch = fmt.encode(ex, ad).batch(torch.arange(len(ex)))
        site, seen = Site(1), torch.zeros(len(ex), dtype=torch.long)
        states = torch.zeros(len(ex), ad.hidden_size)
        spec = Replace(torch.randn(len(ex), ad.hidden_size, generator=torch.Generator().manual_seed(0)))

        def score(rows, out):
            seen[rows] += 1
            states[rows] = out.acts[Site(2)]
        edited_pass(ad, batch, torch.arange(len(ex)), [site], lambda r, sub, at: {site: spec.bind(sub.rows)}, score,
                    read=[Site(2)])
        return states, seen

    ref, _ = edited(_adapter("bert", batch_size=24))
    ad, calls = _adapter("bert", batch_size=24), []
    _inject_oom(ad, 100, calls)
    out, seen = edited(ad)
    assert seen.eq(1).all()  # each row scored once, none lost in the halving
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)  # float32 batch-composition noise only
    assert calls[0] > 100 and max(calls[1:]) <= calls[0] // 2 + calls[0] % 2
    assert (ad.token_cap() or 10**9) <= 100
    batching._LIMITS.clear()


def test_a_single_row_that_does_not_fit_is_a_clear_error():
    batching._LIMITS.clear()
    ad, calls = _adapter("bert", batch_size=4), []
    _inject_oom(ad, 1, calls)
    with pytest.raises(ConfigError, match="does not fit in the memory"):
        ad.map(_examples(4), AgreementFormatter(), read=[Site(1)])
    batching._LIMITS.clear()


def test_other_errors_are_not_swallowed():
    ad = _adapter("bert")

    def run(*a, **k):
        raise RuntimeError("shape mismatch")
    ad.run = run
    with pytest.raises(RuntimeError, match="shape mismatch"):
        ad.map(_examples(4), AgreementFormatter(), read=[Site(1)])


# ----------------------------------------------------------------------------------------------- shards
def _extract(ad, ex, cache, sites, readout=None):
    return extract_sites(ad, ex, "fp", "d", AgreementFormatter(), sites, readout, cache, progress=False)


def _entry_dir(root):
    return next(p for p in (root / "activations").iterdir() if p.is_dir())


def test_sharded_extraction_equals_map_and_reads_back_exactly(tmp_path):
    ex = _examples(50)
    ad = _adapter("gpt_neox", batch_size=8)
    sites = [Site(1), Site(3)]
    cands = CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong)] for e in ex])
    cache = ActivationCache(tmp_path, shard_mb=(32 * 2 * 4 + 256) * 10 / 2**20)  # 10 rows per shard (scores: 256 B)
    acts, scores, hit = _extract(ad, ex, cache, sites, cands)
    assert not hit
    entry = _entry_dir(tmp_path)
    assert len(list((entry / "L1.target").glob("*.safetensors"))) == 5  # 50 rows in shards of 10-12
    ref = ad.map(ex, AgreementFormatter(), read=sites, readout=cands)
    for s in sites:
        torch.testing.assert_close(acts[s], ref.acts[s], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores, ref.scores, atol=1e-5, rtol=1e-5)
    again, scores2, hit = _extract(ad, ex, cache, sites, cands)
    assert hit and all(torch.equal(again[s], acts[s]) for s in sites) and torch.equal(scores2, scores)


def _count_rows(ad) -> list[int]:
    """Make ``ad.stream`` record the item rows it computes; returns the (growing) list."""
    rows: list[int] = []
    real_stream = ad.stream

    def counting(items, *a, **k):
        for chunk in real_stream(items, *a, **k):
            rows.extend(chunk.rows.tolist())
            yield chunk
    ad.stream = counting
    return rows


@pytest.mark.numeric
def test_a_killed_extraction_resumes_from_its_last_shard(tmp_path, monkeypatch):
    ex = _examples(50)
    ad = _adapter("bert", batch_size=4)
    cache = ActivationCache(tmp_path, shard_mb=32 * 4 * 10 / 2**20)  # 10 rows per shard
    from cprobe import cache as cache_mod

    real, written = cache_mod.Entry.write, []

    def dying(self, name, j, t):
        if len(written) == 2:
            raise KeyboardInterrupt  # killed after two shards
        written.append(j)
        real(self, name, j, t)
    monkeypatch.setattr(cache_mod.Entry, "write", dying)
    with pytest.raises(KeyboardInterrupt):
        _extract(ad, ex, cache, [Site(2)])
    monkeypatch.setattr(cache_mod.Entry, "write", real)
    rows = _count_rows(ad)
    acts, _, hit = _extract(ad, ex, cache, [Site(2)])
    assert not hit and len(rows) == 30 and min(rows) == 20  # only the three missing shards
    ref = _adapter("bert", batch_size=4).map(ex, AgreementFormatter(), read=[Site(2)])
    torch.testing.assert_close(acts[Site(2)], ref.acts[Site(2)], atol=1e-5, rtol=1e-5)


def test_a_corrupt_shard_alone_is_recomputed(tmp_path):
    ex = _examples(40)
    ad = _adapter("bert", batch_size=8)
    cache = ActivationCache(tmp_path, shard_mb=32 * 4 * 10 / 2**20)
    first, _, _ = _extract(ad, ex, cache, [Site(1)])
    f = sorted((_entry_dir(tmp_path) / "L1.target").glob("*.safetensors"))[2]
    data = bytearray(f.read_bytes())
    data[-5] ^= 0x10
    f.write_bytes(bytes(data))
    rows = _count_rows(ad)
    again, _, hit = _extract(ad, ex, cache, [Site(1)])
    assert not hit and sorted(rows) == list(range(20, 30))
    torch.testing.assert_close(again[Site(1)], first[Site(1)], atol=1e-5, rtol=1e-5)


def test_stored_in_the_model_dtype_the_key_differs_and_the_tensors_are_bf16(tmp_path):
    ex = _examples(12)
    ad = _adapter("bert")
    a, _, _ = _extract(ad, ex, ActivationCache(tmp_path), [Site(1)])
    ad.model.to(torch.bfloat16)
    b, _, hit = _extract(ad, ex, ActivationCache(tmp_path, dtype="model"), [Site(1)])
    assert not hit and a[Site(1)].dtype == torch.float32 and b[Site(1)].dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------------- streaming fits
def _stream(tmp_path, n=240, d=6, rows_per_shard=50):
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, 3, (n,), generator=g)
    X = torch.randn(n, d, generator=g) + torch.nn.functional.one_hot(z, d).float() * 2
    return X, z, Activations(n, entry=write_activations(tmp_path, {"synthetic": 1}, {"X": X}, rows_per_shard))


@pytest.mark.numeric
def test_streaming_leace_and_mean_diff_equal_their_batch_fits(tmp_path):
    X, z, acts = _stream(tmp_path)
    assert len(list(acts.shards(["X"]))) == 5
    for cls in (LEACE, MeanDiff):
        whole, streamed = cls().fit(X, z), fit_streaming(cls(), acts, "X", z)
        torch.testing.assert_close(streamed.transform(X[:20], z[:20].flip(0)), whole.transform(X[:20], z[:20].flip(0)),
                                   atol=1e-4, rtol=1e-4)
    keep = torch.arange(0, 240, 2)
    part = fit_streaming(MeanDiff(), acts, "X", z, rows=keep)
    torch.testing.assert_close(part.means, MeanDiff().fit(X[keep], z[keep]).means, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="cannot fit from a stream"):
        fit_streaming(object(), acts, "X", z)


@pytest.mark.numeric
def test_a_probe_fits_from_a_stream_one_shard_equals_fit():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(300, 8, generator=g)
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).long()
    probes = (LinearProbe(lrs=(1e-2, 1e-1), epochs=3), MLPProbe(n_layers=(1,), widths=(16,), lrs=(1e-2,), epochs=2))
    for probe in probes:
        whole = type(probe)(**_args(probe)).fit(X, y)
        one = type(probe)(**_args(probe)).fit_stream([(X, y)])
        assert one.best_params == whole.best_params and one.val_accuracy == whole.val_accuracy
        for a, b in zip(one.module.state_dict().values(), whole.module.state_dict().values()):
            assert torch.equal(a, b)
        shards = [(X[i: i + 70], y[i: i + 70]) for i in range(0, 300, 70)]
        many = type(probe)(**_args(probe)).fit_stream(shards)
        assert many.score(X, y) > max(0.7, whole.score(X, y) - 0.1)


def _args(p):
    keys = ("lrs", "epochs", "batch_size", "seed") + (("n_layers", "widths") if isinstance(p, MLPProbe) else ())
    return {k: getattr(p, k) for k in keys}
