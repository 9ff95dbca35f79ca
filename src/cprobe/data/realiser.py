"""The text node of a LIBERTy SCM: concept values + exogenous "grounding" noise → text.

The paper's text node is GPT-4o at temperature 0, conditioned on the concept values, a persona and a template.
Offline, :class:`TemplateRealiser` plays that role deterministically from the SCM file's ``text:`` phrase bank:

- ``openings`` / ``closings`` / ``personas``: concept-neutral sentences; which ones a unit gets is exogenous noise
  (the template and the persona), as is the *order* of the concept sentences (a permutation per unit, so no concept
  sits at a fixed position);
- ``phrases[variable][value]``: alternative sentences stating that value; which alternative a unit uses is exogenous
  too (a uniform draw per variable, mapped onto however many alternatives the value has);
- ``expresses``: the variables the text states (the label may be among them — Violence states the incident, CV the
  strength of the statement — or not: Disease never names the disease).

Because every choice is stored noise, a structural counterfactual re-realised with the same noise differs from
the factual text only in the sentences of the variables whose values changed (the intervened concept and its
descendants), and a counterfactual that changes nothing reproduces the text exactly.

Realisers are registered (:data:`REALISERS`); a user's own generated texts (e.g. LLM-written) come in through
:mod:`cprobe.data.liberty`'s file loader instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cprobe.errors import ConfigError
from cprobe.registry import Registry


class Realiser(Protocol):
    name: str

    def draw(self, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        """Exogenous text noise of ``n`` units (JSON-able; stored with each text)."""

    def realise(self, values: Mapping[str, str], noise: Mapping[str, Any]) -> str:
        """The text of one unit from its concept value names and its text noise."""


REALISERS: Registry[type] = Registry("realiser")

MIN_PHRASES = 1


@REALISERS.register("template")
class TemplateRealiser:
    """Deterministic template realiser over an SCM's phrase bank (see the module docstring)."""

    name = "template"

    def __init__(self, scm: Any) -> None:
        text = scm.text
        where = f"scm {scm.name}: text"
        if not text:
            raise ConfigError(f"{where}: the SCM has no `text:` phrase bank, so the template realiser cannot write "
                              "its texts; add one (see conf/scm/cv.yaml) or load generated texts with dataset.texts=")
        unknown = set(text) - {"expresses", "openings", "closings", "personas", "phrases"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; choose from expresses, openings, closings, "
                              "personas, phrases")
        expresses = text.get("expresses")
        if not isinstance(expresses, Sequence) or isinstance(expresses, str) or not expresses:
            raise ConfigError(f"{where}.expresses must list the variables the text states, got {expresses!r}")
        self.expresses = tuple(str(v) for v in expresses)
        for v in self.expresses:
            if v not in scm.variables:
                raise ConfigError(f"{where}.expresses: unknown variable {v!r}; choose from {list(scm.variables)}")
        self.openings = _sentences(text.get("openings"), f"{where}.openings")
        self.closings = _sentences(text.get("closings"), f"{where}.closings")
        self.personas = _sentences(text.get("personas"), f"{where}.personas")
        phrases = text.get("phrases")
        if not isinstance(phrases, Mapping):
            raise ConfigError(f"{where}.phrases must map each expressed variable to {{value: [sentences]}}")
        self.phrases: dict[str, dict[str, tuple[str, ...]]] = {}
        for v in self.expresses:
            bank = phrases.get(v)
            if not isinstance(bank, Mapping):
                raise ConfigError(f"{where}.phrases.{v}: missing (every expressed variable needs a phrase per value)")
            values = scm.variables[v].values
            extra = set(map(str, bank)) - set(values)
            if extra:
                raise ConfigError(f"{where}.phrases.{v}: unknown value(s) {sorted(extra)}; choose from {list(values)}")
            self.phrases[v] = {}
            for val in values:
                self.phrases[v][val] = _sentences(bank.get(val), f"{where}.phrases.{v}.{val}")

    def draw(self, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        return [{"opening": int(rng.integers(len(self.openings))), "closing": int(rng.integers(len(self.closings))),
                 "persona": int(rng.integers(len(self.personas))),
                 "order": [int(i) for i in rng.permutation(len(self.expresses))],
                 "variant": {v: float(rng.uniform()) for v in self.expresses}} for _ in range(n)]

    def sentences(self, values: Mapping[str, str], noise: Mapping[str, Any]) -> dict[str, str]:
        """The sentence stating each expressed variable's value (variant chosen by the unit's noise)."""
        out = {}
        for v in self.expresses:
            bank = self.phrases[v][values[v]]
            out[v] = bank[min(int(noise["variant"][v] * len(bank)), len(bank) - 1)]
        return out

    def realise(self, values: Mapping[str, str], noise: Mapping[str, Any]) -> str:
        said = self.sentences(values, noise)
        body = [said[self.expresses[i]] for i in noise["order"]]
        parts = [self.openings[noise["opening"]], self.personas[noise["persona"]], *body,
                 self.closings[noise["closing"]]]
        return " ".join(p.strip() for p in parts)


def _sentences(x: Any, where: str) -> tuple[str, ...]:
    if not isinstance(x, Sequence) or isinstance(x, str) or len(x) < MIN_PHRASES:
        raise ConfigError(f"{where} must be a non-empty list of sentences")
    out = tuple(str(s).strip() for s in x)
    if any(not s for s in out):
        raise ConfigError(f"{where} has an empty sentence")
    return out


def build_realiser(name: str, scm: Any) -> Realiser:
    return REALISERS.get(name)(scm)
