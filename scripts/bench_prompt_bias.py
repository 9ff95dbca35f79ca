"""Rank-consistency bootstrap of the prompt-bias study: the vectorised randomised settings against a plain Python
loop over draws, models and relations (the implementation they replaced), in the same process on the same table.

    python scripts/bench_prompt_bias.py [--draws 200] [--models 8] [--relations 24]

Prints CPU seconds per 1000 draws and the speed-up; both give the same numbers at the same seed
(tests/unit/test_prompt_bias_metrics.py checks that).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from cprobe.metrics import prompt_bias as M


def table(models: int, relations: int, prompts: int = 6, subjects: int = 40, seed: int = 0) -> pd.DataFrame:
    """A fact-world-sized prediction table (mentions 1-4 per subject)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(relations):
        mentions = rng.integers(1, 5, subjects)
        for m in range(models):
            acc = 0.2 + 0.6 * m / max(1, models - 1)
            for p in range(prompts):
                for s in range(subjects):
                    for x in range(mentions[s]):
                        rows.append((f"m{m}", f"R{r}", p, f"s{s}", x, bool(rng.random() < acc)))
    return pd.DataFrame(rows, columns=["model", "relation", "prompt", "subject", "mention", "correct"])


def loop(st: M.Stack, n_draws: int, k_prompts: int, k_mentions: int, seed: int) -> np.ndarray:
    """The baseline: one Python call per (draw, model, relation), as before vectorisation."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_draws, len(st.models), len(st.relations)))
    for d in range(n_draws):
        for m in range(len(st.models)):
            for r in range(len(st.relations)):
                n_p, n_s = int(st.n_prompts[r]), int(st.n_subjects[r])
                prompts = rng.choice(n_p, min(k_prompts, n_p), replace=False)
                p1s = []
                for p in prompts:
                    keys = rng.random((n_s, st.correct.shape[4]))
                    keys[np.arange(st.correct.shape[4])[None, :] >= st.n_mentions[r, :n_s, None]] = np.inf
                    take = np.argsort(keys, axis=1)[:, :k_mentions]
                    hits = np.take_along_axis(st.correct[m, r, p, :n_s], take, axis=1)
                    k = np.minimum(k_mentions, st.n_mentions[r, :n_s])
                    valid = np.arange(take.shape[1])[None, :] < k[:, None]
                    p1s.append(round(100.0 * float((np.where(valid, hits, 0).sum(1) / k).mean()), 2))
                out[d, m, r] = np.mean(p1s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--models", type=int, default=8)
    ap.add_argument("--relations", type=int, default=24)
    args = ap.parse_args()
    st = M.stack(table(args.models, args.relations))
    for setting, (kp, kx) in (("random", (1, 1)), ("backdoor_sampled", (3, 2))):
        t0 = time.process_time()
        loop(st, args.draws, kp, kx, 0)
        slow = time.process_time() - t0
        t0 = time.process_time()
        M.sampled_relation_scores(st, args.draws, kp, kx, *M.setting_streams(0, setting))
        fast = time.process_time() - t0
        scale = 1000 / args.draws
        print(f"{setting:17s} loop {slow * scale:7.2f} s / 1000 draws   vectorised {fast * scale:6.2f} s   "
              f"speed-up {slow / fast:5.1f}x")


if __name__ == "__main__":
    main()
