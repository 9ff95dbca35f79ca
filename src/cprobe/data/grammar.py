"""A synthetic English subject–verb agreement grammar with exact labels.

The demo must run offline on models the project trains itself, so the corpus comes from here.
Every sentence has one *main verb* (the target slot) that agrees with its subject; labels are
known by construction rather than parsed:

- ``z_c``: number of the subject ("sg"/"pl") — the concept agreement depends on.
- ``z_e``: number of the closest noun before the verb when that noun is not the subject (an
  *intervening* attractor); ``"none"`` when the closest preceding noun is the subject.
- ``n_attractors``: how many nouns stand strictly between subject and verb.
- ``structure``: the template name.

Attractor numbers are sampled independently of the subject number, so ``z_c`` and ``z_e`` are
balanced and (near) independent.

With ``attractor_agreement`` the main verb also agrees with the attractor (a second, object-style
agreement mark, as in languages with polypersonal agreement): ``is`` after "the author near the guards"
becomes ``is_p`` (``is_s`` after a singular attractor; unmarked when there is none). The wrong form keeps
the attractor mark and flips the subject number (``are_p``), so the task is still subject agreement, but
a model must carry the attractor's number to the verb to predict it — the representation at the verb
then encodes Z_e as BERT's does in Canby et al. (their Z_e oracle: 88%). Some structures put another noun *before* the subject
(``intro_pp``, ``frame``, ``frame_pp``) so a probe that reads "the first noun" is not enough.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cprobe.data.base import NONE, Dataset, Example
from cprobe.errors import ConfigError

SG, PL = "sg", "pl"

NOUNS: tuple[tuple[str, str], ...] = (
    ("author", "authors"), ("pilot", "pilots"), ("guard", "guards"), ("doctor", "doctors"),
    ("farmer", "farmers"), ("teacher", "teachers"), ("senator", "senators"), ("dancer", "dancers"),
    ("singer", "singers"), ("driver", "drivers"), ("manager", "managers"), ("officer", "officers"),
    ("painter", "painters"), ("surgeon", "surgeons"), ("student", "students"), ("lawyer", "lawyers"),
    ("customer", "customers"), ("minister", "ministers"), ("soldier", "soldiers"), ("athlete", "athletes"),
    ("baker", "bakers"), ("nurse", "nurses"), ("waiter", "waiters"), ("king", "kings"),
    ("queen", "queens"), ("neighbor", "neighbors"), ("friend", "friends"), ("child", "children"),
    ("man", "men"), ("woman", "women"), ("person", "people"), ("boy", "boys"),
    ("girl", "girls"), ("cat", "cats"), ("dog", "dogs"), ("horse", "horses"),
    ("bird", "birds"), ("wolf", "wolves"), ("mouse", "mice"), ("fox", "foxes"),
)  # fmt: skip
COPULAS: tuple[tuple[str, str], ...] = (("is", "are"), ("was", "were"))
PERFECT: tuple[tuple[str, str], ...] = (("has", "have"),)
TRANSITIVE: tuple[tuple[str, str], ...] = (
    ("likes", "like"), ("sees", "see"), ("admires", "admire"), ("knows", "know"),
    ("hates", "hate"), ("helps", "help"), ("meets", "meet"), ("follows", "follow"),
    ("trusts", "trust"), ("visits", "visit"), ("watches", "watch"), ("praises", "praise"),
)  # fmt: skip
INTRANSITIVE: tuple[tuple[str, str], ...] = (
    ("smiles", "smile"), ("sleeps", "sleep"), ("laughs", "laugh"), ("waits", "wait"),
    ("works", "work"), ("sings", "sing"), ("runs", "run"), ("swims", "swim"),
)  # fmt: skip
FRAME_VERBS: tuple[tuple[str, str], ...] = (
    ("says", "say"), ("thinks", "think"), ("believes", "believe"), ("hopes", "hope"), ("knows", "know"),
)
ADJECTIVES = ("happy", "tired", "old", "young", "ready", "late", "here", "angry", "brave", "busy", "quiet", "famous")
PARTICIPLES = ("left", "arrived", "won", "lost", "slept", "waited", "returned", "smiled")
ADVERBS = ("today", "often", "again", "now", "here")
PREPOSITIONS = ("near", "behind", "beside", "with", "from", "for", "above", "around")
FUNCTION_WORDS = ("the", "that", ",", ".")

PROPERTIES = ("z_c", "z_e", "n_attractors", "structure")


@dataclass(frozen=True)
class _Sentence:
    """A template's output: words, target index and the labels the template knows."""

    words: list[str]
    target: int
    correct: str
    wrong: str
    z_c: str
    z_e: str
    n_attractors: int


class _Builder:
    """Shared sampling helpers; one per ``generate`` call so the RNG stream is the only state."""

    def __init__(self, rng: random.Random, nouns: Sequence[tuple[str, str]], attractor_agreement: bool = False) -> None:
        self.rng = rng
        self.nouns = nouns
        self.attractor_agreement = attractor_agreement
        self.flip_subject = False

    def number(self) -> str:
        return self.rng.choice((SG, PL))

    def subject_number(self) -> str:
        """The subject's number (z_c): one draw like :meth:`number`, flipped while building a minimal-pair twin."""
        n = self.number()
        return (PL if n == SG else SG) if self.flip_subject else n

    def lemmas(self, k: int) -> list[tuple[str, str]]:
        """``k`` distinct noun lemmas, so no sentence repeats a noun (labels stay unambiguous)."""
        return self.rng.sample(list(self.nouns), k)

    @staticmethod
    def form(pair: tuple[str, str], number: str) -> str:
        return pair[0] if number == SG else pair[1]

    def np_(self, lemma: tuple[str, str], number: str) -> list[str]:
        return ["the", self.form(lemma, number)]

    def main_verb(self, number: str) -> tuple[str, str, list[str]]:
        """(correct, wrong, continuation): the agreeing verb and the words after it."""
        kind = self.rng.randrange(4)
        if kind == 0:
            pair, rest = self.rng.choice(COPULAS), [self.rng.choice(ADJECTIVES)]
        elif kind == 1:
            pair, rest = self.rng.choice(PERFECT), [self.rng.choice(PARTICIPLES)]
        elif kind == 2:
            obj = self.rng.choice(self.nouns)
            pair, rest = self.rng.choice(TRANSITIVE), self.np_(obj, self.number())
        else:
            pair, rest = self.rng.choice(INTRANSITIVE), [self.rng.choice(ADVERBS)]
        other = PL if number == SG else SG
        return self.form(pair, number), self.form(pair, other), [*rest, "."]

    def finish(self, before: list[str], z_c: str, z_e: str, n_attractors: int) -> _Sentence:
        correct, wrong, rest = self.main_verb(z_c)
        if self.attractor_agreement:
            correct, wrong = mark(correct, z_e), mark(wrong, z_e)
        return _Sentence([*before, correct, *rest], len(before), correct, wrong, z_c, z_e, n_attractors)


ATTRACTOR_MARKS = {SG: "_s", PL: "_p"}
"""The verb's attractor-agreement suffix (``attractor_agreement``); none when there is no attractor."""


def mark(verb: str, z_e: str) -> str:
    """``verb`` with the attractor-agreement mark for attractor number ``z_e`` (unchanged for ``none``)."""
    return verb + ATTRACTOR_MARKS.get(z_e, "")


def _simple(b: _Builder) -> _Sentence:
    (s,) = b.lemmas(1)
    zc = b.subject_number()
    return b.finish(b.np_(s, zc), zc, NONE, 0)


def _pp(b: _Builder) -> _Sentence:
    s, a = b.lemmas(2)
    zc, za = b.subject_number(), b.number()
    return b.finish([*b.np_(s, zc), b.rng.choice(PREPOSITIONS), *b.np_(a, za)], zc, za, 1)


def _pp_pp(b: _Builder) -> _Sentence:
    s, a1, a2 = b.lemmas(3)
    zc, z1, z2 = b.subject_number(), b.number(), b.number()
    p1, p2 = b.rng.choice(PREPOSITIONS), b.rng.choice(PREPOSITIONS)
    return b.finish([*b.np_(s, zc), p1, *b.np_(a1, z1), p2, *b.np_(a2, z2)], zc, z2, 2)


def _subj_rel(b: _Builder) -> _Sentence:
    s, a = b.lemmas(2)
    zc, za = b.subject_number(), b.number()
    rel = b.form(b.rng.choice(TRANSITIVE), zc)  # the relative verb agrees with the head noun
    return b.finish([*b.np_(s, zc), "that", rel, *b.np_(a, za)], zc, za, 1)


def _obj_rel(b: _Builder) -> _Sentence:
    s, a = b.lemmas(2)
    zc, za = b.subject_number(), b.number()
    rel = b.form(b.rng.choice(TRANSITIVE), za)  # the relative verb agrees with the attractor
    return b.finish([*b.np_(s, zc), "that", *b.np_(a, za), rel], zc, za, 1)


def _intro_pp(b: _Builder) -> _Sentence:
    s, f = b.lemmas(2)
    zc, zf = b.subject_number(), b.number()
    return b.finish([b.rng.choice(PREPOSITIONS), *b.np_(f, zf), ",", *b.np_(s, zc)], zc, NONE, 0)


def _frame_words(b: _Builder, lemma: tuple[str, str]) -> list[str]:
    zf = b.number()
    return [*b.np_(lemma, zf), b.form(b.rng.choice(FRAME_VERBS), zf), "that"]


def _frame(b: _Builder) -> _Sentence:
    s, f = b.lemmas(2)
    zc = b.subject_number()
    return b.finish([*_frame_words(b, f), *b.np_(s, zc)], zc, NONE, 0)


def _frame_pp(b: _Builder) -> _Sentence:
    s, f, a = b.lemmas(3)
    zc, za = b.subject_number(), b.number()
    frame = _frame_words(b, f)
    return b.finish([*frame, *b.np_(s, zc), b.rng.choice(PREPOSITIONS), *b.np_(a, za)], zc, za, 1)


STRUCTURES: dict[str, Callable[[_Builder], _Sentence]] = {
    "simple": _simple,  # the author is happy .
    "pp": _pp,  # the author near the guards is happy .
    "pp_pp": _pp_pp,  # the author near the guards behind the dog is happy .
    "subj_rel": _subj_rel,  # the author that likes the guards is happy .
    "obj_rel": _obj_rel,  # the author that the guards like is happy .
    "intro_pp": _intro_pp,  # near the guards , the author is happy .
    "frame": _frame,  # the guards say that the author is happy .
    "frame_pp": _frame_pp,  # the guards say that the author near the dog is happy .
}
DEFAULT_MIX: tuple[tuple[str, float], ...] = tuple((name, 1.0) for name in STRUCTURES)


@dataclass(frozen=True)
class GrammarConfig:
    """What to generate. ``structures`` is (name, weight) pairs; a mapping is accepted too."""

    n_sentences: int = 4000
    seed: int = 0
    structures: tuple[tuple[str, float], ...] = field(default=DEFAULT_MIX)
    n_nouns: int = len(NOUNS)
    attractor_agreement: bool = False  # the main verb also agrees with the attractor (see the module doc)

    def __post_init__(self) -> None:
        mix = self.structures.items() if isinstance(self.structures, Mapping) else self.structures
        try:
            pairs = tuple((str(name), float(weight)) for name, weight in mix)
        except (TypeError, ValueError):
            raise ConfigError(
                f"grammar.structures must be (name, weight) pairs, got {self.structures!r}"
            ) from None
        object.__setattr__(self, "structures", pairs)
        if self.n_sentences < 1:
            raise ConfigError(f"grammar.n_sentences must be >= 1, got {self.n_sentences}")
        if not 3 <= self.n_nouns <= len(NOUNS):
            raise ConfigError(f"grammar.n_nouns must be in [3, {len(NOUNS)}], got {self.n_nouns}")
        unknown = sorted({n for n, _ in pairs} - STRUCTURES.keys())
        if unknown:
            raise ConfigError(f"unknown grammar structure(s) {unknown}; choose from {list(STRUCTURES)}")
        if len({n for n, _ in pairs}) != len(pairs):
            raise ConfigError(f"grammar.structures lists a structure twice: {[n for n, _ in pairs]}")
        if any(w < 0 for _, w in pairs) or sum(w for _, w in pairs) <= 0:
            raise ConfigError(f"grammar.structures weights must be >= 0 with a positive sum, got {pairs}")


FLIPPABLE = ("z_c",)
"""Properties :func:`generate` can flip to emit minimal pairs."""


def generate(cfg: GrammarConfig, flip: str | None = None) -> Dataset:
    """``cfg.n_sentences`` labelled agreement sentences, deterministic given ``cfg``.

    ``flip="z_c"`` gives each sentence's **minimal-pair twin** instead, under the same id: the same draws (nouns,
    verbs, attractors, structure) with only the subject's number flipped — and with it every word that agrees with
    the subject (the subject noun, a subject relative's verb, the main verb: the twin's correct verb is the base's
    wrong one). A base and its twin differ only in z_c, as DAS's interchange needs (a source that differs from
    its base only in the property)."""
    if flip is not None and flip not in FLIPPABLE:
        raise ConfigError(f"the agreement grammar can flip {list(FLIPPABLE)} to emit minimal pairs, not {flip!r}")
    rng = random.Random(cfg.seed)
    builder = _Builder(rng, NOUNS[: cfg.n_nouns], cfg.attractor_agreement)
    names = [n for n, _ in cfg.structures]
    weights = [w for _, w in cfg.structures]
    examples = []
    for i in range(cfg.n_sentences):
        name = rng.choices(names, weights)[0]
        if flip is not None:  # the twin: replay the sentence's draws with the subject's number flipped
            state = rng.getstate()
            STRUCTURES[name](builder)
            after = rng.getstate()
            rng.setstate(state)
            builder.flip_subject = True
            s = STRUCTURES[name](builder)
            builder.flip_subject = False
            assert rng.getstate() == after, "a minimal-pair twin must consume the same draws"
        else:
            s = STRUCTURES[name](builder)
        props = {"z_c": s.z_c, "z_e": s.z_e, "n_attractors": str(s.n_attractors), "structure": name}
        examples.append(Example(f"grammar-{cfg.seed}-{i:06d}", tuple(s.words), s.target, s.correct, s.wrong, props))
    return Dataset("grammar", tuple(examples), PROPERTIES)


def vocabulary(cfg: GrammarConfig) -> list[str]:
    """Every word ``generate(cfg)`` can produce, sorted (the tiny models' word-level vocabulary)."""
    words: set[str] = set(FUNCTION_WORDS) | set(ADJECTIVES) | set(PARTICIPLES) | set(ADVERBS)
    words |= set(PREPOSITIONS)
    for pairs in (NOUNS[: cfg.n_nouns], COPULAS, PERFECT, TRANSITIVE, INTRANSITIVE, FRAME_VERBS):
        for pair in pairs:
            words.update(pair)
    if cfg.attractor_agreement:
        for pairs in (COPULAS, PERFECT, TRANSITIVE, INTRANSITIVE):
            words.update(mark(v, z) for pair in pairs for v in pair for z in ATTRACTOR_MARKS)
    return sorted(words)
