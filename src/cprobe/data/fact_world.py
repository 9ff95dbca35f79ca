"""A generated world of facts with known ground truth, and pre-training corpora whose exposure is skewed on purpose
(``dataset=fact_world``) — the offline stand-in for LAMA + Wikipedia in Cao et al. (2022).

The world (:func:`generate_world`, fixed by ``dataset.seed``): entities with a default name and 0..``max_aliases``
aliases; ``n_relations`` N-1 relations, ``objects_per_relation`` objects (a Zipf prior
over them) and ``prompts_per_relation`` paraphrases built from :data:`FRAMES`, each with a relation word of its own
(the first one is the "original" prompt); ``facts_per_relation`` facts per relation; a popularity rank per fact. Every name is one made-up word, so
objects are single tokens by construction.

A corpus (:func:`sample_corpus`, one per model: :class:`CorpusSpec`) is ``sentences`` sentences, a share ``gamma``
of them *evidence* (one fact stated with one prompt and one mention of its subject) and the rest filler text (random
words with entity and object names in no factual context). Its exposure is skewed three ways, each by a Zipf law
with its own exponent over an order drawn from ``skew_seed`` — the corpus's own "linguistic distribution":

- facts by popularity (``fact_skew``; the order is the world's, so popular facts are popular for every model);
- a relation's prompts (``prompt_skew``; each corpus prefers its own prompts, so the original prompt favours some
  models and not others — the paper's prompt-preference backdoor path M ← C ← L → P → E);
- a subject's mentions (``alias_skew``; each corpus has its own favourite names — instance verbalization).

:class:`Corpus` keeps how often each fact, (fact, prompt) and (fact, mention) was seen: the ground truth the biases
are measured against.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cprobe.data.items import OBJECT_SLOT
from cprobe.data.lama import SUBJECT_SLOT, Fact, FactData, Relation
from cprobe.errors import ConfigError

# Paraphrase frames ({w}: a word of the relation's own, one per paraphrase, as real paraphrases use different words:
# "born in" / "birthplace" / "native of"); [Y] is last in every one, so causal LMs read the same query as masked LMs.
# The first is the "original" prompt.
FRAMES = (
    "[X] {w} [Y] .",
    "the {w} of [X] is [Y] .",
    "[X] has the {w} [Y] .",
    "as for [X] , its {w} is [Y] .",
    "[X] is known to {w} [Y] .",
    "people say that [X] {w} [Y] .",
    "in short , the {w} of [X] is [Y] .",
    "it is said [X] {w} [Y] .",
)
_FUNCTION = ("the", "a", "of", "is", "was", "and", "in", "to", "with", "near", "from", "by", "on", "that", "it",
             "has", "as", "for", "its", "people", "say", "known", "short", "said", ",", ".")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl", "kr", "pl", "st",
           "tr", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "k")


@dataclass(frozen=True)
class FactWorldKeys:
    """``dataset=fact_world`` keys."""

    n_relations: int = 24
    n_entities: int = 240
    facts_per_relation: int = 40
    objects_per_relation: int = 8
    prompts_per_relation: int = 6  # >= 5 (the paper's minimum), <= len(FRAMES)
    max_aliases: int = 3  # aliases per entity besides its default name: 0..max_aliases, uniform
    object_skew: float = 1.0  # Zipf exponent of a relation's object prior
    filler_words: int = 300
    world_seed: int = 0  # the world (every job seed probes the same world)


def check_world_keys(k: FactWorldKeys) -> None:
    if k.n_relations < 2:
        raise ConfigError(f"dataset.n_relations must be >= 2, got {k.n_relations}")
    if not 1 <= k.prompts_per_relation <= len(FRAMES):
        raise ConfigError(f"dataset.prompts_per_relation must be in [1, {len(FRAMES)}], got {k.prompts_per_relation}")
    if k.objects_per_relation < 2 or k.facts_per_relation < 1:
        raise ConfigError("dataset.objects_per_relation must be >= 2 and dataset.facts_per_relation >= 1")
    if k.facts_per_relation > k.n_entities:
        raise ConfigError(f"dataset.facts_per_relation ({k.facts_per_relation}) exceeds dataset.n_entities "
                          f"({k.n_entities}): a relation's subjects are distinct entities")
    if not 0 <= k.max_aliases <= 4:
        raise ConfigError(f"dataset.max_aliases must be in [0, 4] (at most 5 mentions), got {k.max_aliases}")
    if k.object_skew < 0 or k.filler_words < 10:
        raise ConfigError("dataset.object_skew must be >= 0 and dataset.filler_words >= 10")


@dataclass(frozen=True)
class World:
    """What generated the facts, beyond them: the vocabulary and each fact's popularity rank (0 = most popular)."""

    keys: FactWorldKeys
    seed: int
    entities: tuple[tuple[str, ...], ...]  # per entity: its mentions, the default name first
    objects: dict[str, tuple[str, ...]]  # per relation
    popularity: np.ndarray  # per fact (FactData.facts order): its rank
    filler: tuple[str, ...]
    relation_words: tuple[str, ...]  # each relation's word per paraphrase

    def words(self) -> list[str]:
        """Every word any corpus of this world can hold (the tiny models' vocabulary)."""
        ws = set(_FUNCTION) | set(self.filler) | set(self.relation_words) | {m for e in self.entities for m in e}
        ws |= {o for objs in self.objects.values() for o in objs}
        return sorted(ws)


class _Names:
    """Distinct made-up single words."""

    def __init__(self, rng: np.random.Generator, taken: set[str]) -> None:
        self.rng, self.taken = rng, set(taken)

    def __call__(self) -> str:
        for _ in range(10_000):
            n = int(self.rng.integers(2, 4))
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)) + self.rng.choice(_CODAS)
            if w not in self.taken:
                self.taken.add(w)
                return w
        raise ConfigError("ran out of made-up names; lower the world's size")


def zipf(n: int, exponent: float) -> np.ndarray:
    """Normalised Zipf weights 1 / rank^exponent over ranks 1..n."""
    w = 1.0 / np.arange(1, n + 1) ** exponent
    return w / w.sum()


def generate_world(keys: FactWorldKeys, name: str = "fact_world") -> FactData:
    """The world's relations, prompts and facts (``FactData.world`` holds the rest)."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    check_world_keys(keys)
    seed = keys.world_seed
    rng = np.random.default_rng([seed, 7])
    names = _Names(rng, set(_FUNCTION) | set(ENGLISH_STOP_WORDS))
    entities = tuple(tuple(names() for _ in range(1 + int(rng.integers(0, keys.max_aliases + 1))))
                     for _ in range(keys.n_entities))
    relations: dict[str, Relation] = {}
    relation_words: list[str] = []
    objects: dict[str, tuple[str, ...]] = {}
    facts: list[Fact] = []
    for r in range(keys.n_relations):
        rid = f"R{r + 1:02d}"
        frames = FRAMES[: keys.prompts_per_relation]
        words = [names() for _ in frames]
        relation_words += words
        relations[rid] = Relation(rid, words[0], tuple(f.format(w=w) for f, w in zip(frames, words)))
        objects[rid] = tuple(names() for _ in range(keys.objects_per_relation))
        prior = zipf(keys.objects_per_relation, keys.object_skew)[rng.permutation(keys.objects_per_relation)]
        for e in sorted(rng.choice(keys.n_entities, keys.facts_per_relation, replace=False).tolist()):
            facts.append(Fact(rid, f"E{e:04d}", entities[e], objects[rid][int(rng.choice(len(prior), p=prior))]))
    filler = tuple(names() for _ in range(keys.filler_words))
    world = World(keys, seed, entities, objects, rng.permutation(len(facts)), filler, tuple(relation_words))
    return FactData(name, f"generated (cprobe.data.fact_world, seed {seed})", relations, tuple(facts), (), world)


# ----------------------------------------------------------------------------------------------- corpora
@dataclass(frozen=True)
class CorpusSpec:
    """One pre-training corpus of a fact world (part of a trained model's cache key)."""

    sentences: int = 30_000
    gamma: float = 0.5  # share of evidence sentences
    fact_skew: float = 1.0  # Zipf exponent over facts by popularity
    prompt_skew: float = 1.5  # Zipf exponent over a relation's prompts (order drawn from skew_seed)
    alias_skew: float = 1.5  # Zipf exponent over a subject's mentions (order drawn from skew_seed)
    skew_seed: int = 0  # the corpus's linguistic preferences
    seed: int = 0  # which sentences

    def __post_init__(self) -> None:
        if self.sentences < 1:
            raise ConfigError(f"corpus.sentences must be >= 1, got {self.sentences}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"corpus.gamma must be in [0, 1], got {self.gamma}")
        if min(self.fact_skew, self.prompt_skew, self.alias_skew) < 0:
            raise ConfigError("corpus skews (fact_skew, prompt_skew, alias_skew) must be >= 0")

    def key(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Corpus:
    """Sentences (words joined by spaces), the word index of each evidence sentence's object (−1 for filler), and
    exposure counts: per fact, per (fact, prompt) and per (fact, mention)."""

    sentences: list[str]
    object_word: list[int]
    fact_counts: np.ndarray
    prompt_counts: np.ndarray  # (n_facts, max_prompts)
    mention_counts: np.ndarray  # (n_facts, max_mentions)


def preference(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf weights over ``n`` options in an order drawn from ``rng``."""
    return zipf(n, exponent)[rng.permutation(n)]


def sample_corpus(data: FactData, spec: CorpusSpec) -> Corpus:
    """A corpus of ``data.world`` (module docstring); deterministic in (world, spec)."""
    world: World = data.world
    if world is None:
        raise ConfigError("sample_corpus needs a generated fact world (dataset=fact_world)")
    facts = data.facts
    rels = list(data.relations)
    n_prompts = max(len(r.prompts) for r in data.relations.values())
    n_mentions = max(len(f.mentions) for f in facts)
    pref = np.random.default_rng([spec.skew_seed, 11])
    prompt_w = {r: preference(len(data.relations[r].prompts), spec.prompt_skew, pref) for r in rels}
    mention_w = {e: preference(len(m), spec.alias_skew, pref) for e, m in enumerate(world.entities)}
    popularity = zipf(len(facts), spec.fact_skew)[world.popularity]
    rng = np.random.default_rng([spec.seed, spec.skew_seed, 13])
    n_evidence = round(spec.gamma * spec.sentences)
    kinds = np.zeros(spec.sentences, dtype=bool)
    kinds[rng.choice(spec.sentences, n_evidence, replace=False)] = True
    counts = np.zeros(len(facts), dtype=np.int64)
    p_counts = np.zeros((len(facts), n_prompts), dtype=np.int64)
    m_counts = np.zeros((len(facts), n_mentions), dtype=np.int64)
    chosen = rng.choice(len(facts), n_evidence, p=popularity)
    sentences, obj_pos = [], []
    ev = iter(chosen.tolist())
    all_objects = [o for r in rels for o in world.objects[r]]
    for is_evidence in kinds.tolist():
        if is_evidence:
            i = next(ev)
            f = facts[i]
            p = int(rng.choice(len(prompt_w[f.relation]), p=prompt_w[f.relation]))
            ent = int(f.subject[1:])
            m = int(rng.choice(len(f.mentions), p=mention_w[ent]))
            counts[i] += 1
            p_counts[i, p] += 1
            m_counts[i, m] += 1
            text = data.relations[f.relation].prompts[p].replace(SUBJECT_SLOT, f.mentions[m])
            words = text.split()
            obj_pos.append(words.index(OBJECT_SLOT))
            words[obj_pos[-1]] = f.object
            sentences.append(" ".join(words))
        else:
            words = [str(w) for w in rng.choice(world.filler, int(rng.integers(5, 11)))]
            if rng.random() < 0.5:  # entity and object names also occur outside facts
                e = world.entities[int(rng.integers(len(world.entities)))]
                words.insert(int(rng.integers(len(words) + 1)), e[int(rng.integers(len(e)))])
            if rng.random() < 0.3:
                words.insert(int(rng.integers(len(words) + 1)), all_objects[int(rng.integers(len(all_objects)))])
            sentences.append(" ".join([*words, "."]))
            obj_pos.append(-1)
    return Corpus(sentences, obj_pos, counts, p_counts, m_counts)
