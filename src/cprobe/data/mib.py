"""MIB's causal variable track, offline (Mueller et al. 2025, "MIB: A Mechanistic Interpretability Benchmark").

MIB loads its counterfactual datasets from a hub; here each task is built from MIB's own task definitions, as MIB's
code (``MIB-causal-variable-track/tasks/``, and the offline generators of its ``CausalAbstraction`` submodule) builds
them, seeded:

- a **causal model** (:class:`CausalModel`): variables in topological order, their parents and mechanisms;
  ``run`` computes a setting from the inputs (and any intervened values), ``interchange`` sets each target variable
  to its value in a source's run (MIB's ``run_interchange``) — the label of an interchange intervention;
- **counterfactual kinds**: how a (base, source) pair is sampled, with MIB's names;
- **token positions**: MIB's ids, each a region of the prompt whose last token is the site (``last_token``: the
  prompt's last token);
- the **checker** MIB scores a generated output with, and how many tokens it generates.

Tasks (:data:`MIB_TASKS`; MIB's task id in brackets):

- ``mcqa`` (``4_answer_MCQA``): object–colour pairs (``object_color_pairs.json``), four choices; variables
  ``answer_pointer`` (which choice is right) and ``answer`` (its letter); kinds ``answerPosition`` (the right choice
  moved to another position), ``randomLetter`` (four new letters), ``answerPosition_randomLetter`` (a new sample with
  the same question: new choices, letters and position);
- ``arithmetic`` (``arithmetic``): two two-digit operands, variable ``ones_carry``; kinds ``random`` and
  ``ones_carry`` (the ones digits changed so that the carry flips);
- ``ioi`` (``ioi_task``): names, objects, places and templates (``ioi_*.json``); variables ``output_token`` and
  ``output_position``; kinds ``s1_io_flip``, ``s2_io_flip``, ``s1_ioi_flip_s2_ioi_flip`` (the base's names
  rearranged);
- ``ravel`` (``ravel_task``): cities with Country, Continent and Language (MIB's ``ravel_city_entity.json`` or
  RAVEL's ``ravel_city_entity_attributes.json``); kinds ``attribute`` (another city, any attribute queried) and
  ``wikipedia`` (another city, MIB's ``Q: What is {city}? A:``);
- ``arc`` (``ARC_easy``): ARC-Easy questions from a JSONL file given by path (``question``, ``choices`` with
  ``text`` and ``label``, ``answerKey``), the MCQA kinds and variables.

MIB's JSON task files for MCQA and IOI are Apache-2.0 and ship in ``cprobe/data/mib_files`` (with MIB's LICENSE and
SOURCE.md); ``files`` points a task at other copies.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cprobe.data.items import TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.registry import Registry

FILES = Path(__file__).resolve().parent / "mib_files"
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
N_CHOICES = 4
LAST = "last_token"
"""MIB's id of the prompt's last token (a position of every task)."""


class CausalModel:
    """Variables in topological order, each with its parents and a mechanism of their values; variables without a
    mechanism are inputs."""

    def __init__(self, variables: Sequence[str], parents: Mapping[str, Sequence[str]],
                 mechanisms: Mapping[str, Callable[..., Any]]) -> None:
        self.variables = tuple(variables)
        self.parents = {v: tuple(parents.get(v, ())) for v in self.variables}
        self.mechanisms = dict(mechanisms)
        for v in self.variables:
            late = [p for p in self.parents[v] if self.variables.index(p) > self.variables.index(v)]
            if late:
                raise ValueError(f"variable {v!r} comes before its parents {late}")

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(v for v in self.variables if v not in self.mechanisms)

    def run(self, setting: Mapping[str, Any]) -> dict[str, Any]:
        """Every variable's value: those in ``setting`` (the inputs, and any intervened variable) as given, the others
        by their mechanisms."""
        out = dict(setting)
        for v in self.variables:
            if v not in out:
                out[v] = self.mechanisms[v](*(out[p] for p in self.parents[v]))
        return out

    def interchange(self, base: Mapping[str, Any], sources: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The base's run with each variable of ``sources`` set to its value in that source's run (MIB's
        ``run_interchange``)."""
        return self.run({**base, **{v: self.run(s)[v] for v, s in sources.items()}})


Checker = Callable[[str, str], bool]


@dataclass(frozen=True)
class Task:
    """One MIB task (module doc). ``render(inputs) -> (regions, region names)``: the prompt, split so that every
    position's token ends a region; ``sample(kind, rng) -> (base inputs, source inputs)``; ``output(setting)``: the
    raw output the model should generate; ``check(generated text, expected)``: MIB's checker."""

    key: str
    mib_id: str
    variables: tuple[str, ...]
    kinds: tuple[str, ...]
    positions: tuple[str, ...]
    model: CausalModel
    render: Callable[[Mapping[str, Any]], tuple[list[str], list[str]]]
    sample: Callable[[str, random.Random], tuple[dict[str, Any], dict[str, Any]]]
    output: Callable[[Mapping[str, Any]], str]
    check: Checker
    max_new_tokens: int = 1
    notes: tuple[str, ...] = field(default=())

    def variable(self, name: str) -> str:
        if name not in self.variables:
            raise ConfigError(f"unknown variable {name!r} of MIB task {self.key!r}; choose from {list(self.variables)}")
        return name

    def kind(self, name: str) -> str:
        if name not in self.kinds:
            raise ConfigError(f"unknown counterfactual kind {name!r} of MIB task {self.key!r}; choose from "
                              f"{list(self.kinds)}")
        return name

    def position(self, name: str) -> str:
        """The formatter position (``region:r`` or ``last``) of MIB position id ``name``."""
        if name not in self.positions:
            raise ConfigError(f"unknown token position {name!r} of MIB task {self.key!r}; choose from "
                              f"{list(self.positions)}")
        return "last" if name == LAST else f"region:{self.region_of(name)}"

    def region_of(self, name: str) -> int:
        probe = self.sample(self.kinds[0], random.Random(0))[0]
        return self.render(probe)[1].index(name)

    def item(self, inputs: Mapping[str, Any], id: str) -> TextItem:
        """The prompt of ``inputs`` as a region-aligned item; ``meta`` keeps the inputs and the expected output."""
        regions, names = self.render(inputs)
        return TextItem(id, "".join(regions), regions=tuple(regions), region_names=tuple(names),
                        outcome=self.output(self.model.run(inputs)), meta={"inputs": dict(inputs)})

    def label(self, base: Mapping[str, Any], source: Mapping[str, Any], variable: str) -> str:
        """The expected output of the base with ``variable`` interchanged from the source."""
        return self.output(self.model.interchange(base, {self.variable(variable): source}))


@dataclass(frozen=True)
class Pair:
    """A sampled (base, source) pair of one counterfactual kind, as items, with its inputs."""

    id: str
    kind: str
    base: TextItem
    source: TextItem
    base_inputs: Mapping[str, Any]
    source_inputs: Mapping[str, Any]


def pairs(task: Task, kind: str, n: int, seed: int, prefix: str = "") -> list[Pair]:
    """``n`` pairs of ``kind``, sampled with ``random.Random([seed, kind])`` (the same seed gives the same pairs)."""
    rng = random.Random(f"{seed}/{task.key}/{task.kind(kind)}")
    out = []
    for i in range(n):
        b, s = task.sample(kind, rng)
        pid = f"{prefix}{task.key}/{kind}/{i}"
        out.append(Pair(pid, kind, task.item(b, f"{pid}/base"), task.item(s, f"{pid}/source"), b, s))
    return out


MIB_TASKS: Registry[Callable[[Mapping[str, Any]], Task]] = Registry("MIB task")
"""Task key -> ``build(files)``: the task from its files (``files``: the task's file settings; module doc)."""

_CHOICE = (("answer_pointer", "answer"), ("answerPosition", "randomLetter", "answerPosition_randomLetter"),
           ("correct_symbol", "correct_symbol_period", "last_token"))
SPECS = {"mcqa": ("4_answer_MCQA", *_CHOICE), "arc": ("ARC_easy", *_CHOICE),
         "arithmetic": ("arithmetic", ("ones_carry",), ("random", "ones_carry"), ("op2_last", "last_token")),
         "ioi": ("ioi_task", ("output_token", "output_position"),
                 ("s1_io_flip", "s2_io_flip", "s1_ioi_flip_s2_ioi_flip"), ("s2_name", "last_token")),
         "ravel": ("ravel_task", ("Country", "Continent", "Language"), ("attribute", "wikipedia"),
                   ("entity_last_token", "last_token"))}
"""Each task's MIB id, variables, counterfactual kinds and token positions, known before its files are read."""


def check_names(task: str, variables: Sequence[str] = (), kinds: Sequence[str] = (),
                positions: Sequence[str] = ()) -> None:
    """One line for an unknown task, variable, counterfactual kind or position (no file read)."""
    if task not in SPECS:
        raise ConfigError(f"unknown MIB task {task!r}; choose from {sorted(SPECS)}")
    _, known_v, known_k, known_p = SPECS[task]
    for what, given, known in (("variable", variables, known_v), ("counterfactual kind", kinds, known_k),
                               ("token position", positions, known_p)):
        bad = [x for x in given if x not in known]
        if bad:
            raise ConfigError(f"unknown {what} {bad[0]!r} of MIB task {task!r}; choose from {list(known)}")


def build_task(name: str, files: Mapping[str, Any] | None = None) -> Task:
    """MIB task ``name`` (one line naming the choices where it is unknown)."""
    check_names(name)
    return MIB_TASKS.get(name)(dict(files or {}))


def _json(path: Path | str, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"MIB {what}: no file {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"MIB {what}: {p} is not JSON ({e.msg}, line {e.lineno})") from None


def _contains(output: str, expected: str) -> bool:
    """MCQA's, ARC's and IOI's checker: the expected text inside the generated one."""
    return expected.strip() in output


# ----------------------------------------------------------------------------------------------- multiple choice
def _choice_model(question: bool) -> CausalModel:
    """MCQA's (``question`` known) and ARC's (``answerKey`` given) causal model: answer_pointer, then the answer
    letter ``" " + symbol[answer_pointer]``."""
    syms = [f"symbol{i}" for i in range(N_CHOICES)]
    choices = [f"choice{i}" for i in range(N_CHOICES)]
    if question:
        pointer = (["question", *choices], lambda q, *cs: next((i for i, c in enumerate(cs) if c == q[0]), None))
    else:
        pointer = (["answerKey"], lambda key: key)
    head = ["question", *choices] if question else ["answerKey"]
    return CausalModel([*head, *syms, "answer_pointer", "answer"],
                       {"answer_pointer": pointer[0], "answer": ["answer_pointer", *syms]},
                       {"answer_pointer": pointer[1], "answer": lambda p, *s: None if p is None else " " + s[p]})


def _choice_render(head: str, inputs: Mapping[str, Any], texts: Sequence[str], pointer: int
                   ) -> tuple[list[str], list[str]]:
    """``head``, one line ``X. text`` per choice, ``Answer:``; regions end at the right choice's letter and at the
    period after it (MIB's ``correct_symbol`` and ``correct_symbol_period``)."""
    lines = [f"\n{inputs[f'symbol{i}']}. {t}" for i, t in enumerate(texts)]
    text = head + "".join(lines) + "\nAnswer:"
    at = len(head) + sum(len(x) for x in lines[:pointer]) + 2  # just past the letter
    return [text[: at - 1], text[at - 1: at], text[at: at + 1], text[at + 1:]], \
        ["prefix", "correct_symbol", "correct_symbol_period", "rest"]


def _new_letters(inputs: dict[str, Any], rng: random.Random) -> None:
    used = {inputs[f"symbol{i}"] for i in range(N_CHOICES)}
    for i, s in enumerate(rng.sample([a for a in ALPHABET if a not in used], N_CHOICES)):
        inputs[f"symbol{i}"] = s


def _move_answer(inputs: dict[str, Any], pointer: int, rng: random.Random, keyed: bool) -> None:
    new = rng.choice([i for i in range(N_CHOICES) if i != pointer])
    a, b = f"choice{pointer}", f"choice{new}"
    inputs[a], inputs[b] = inputs[b], inputs[a]
    if keyed:
        inputs["answerKey"] = new


@MIB_TASKS.register("mcqa")
def mcqa(files: Mapping[str, Any]) -> Task:
    data = _json(files.get("pairs", FILES / "object_color_pairs.json"), "object-colour pairs")
    color_objects = [(d["color"], d["object"]) for d in data]
    colors = [d["color"] for d in data]
    model = _choice_model(question=True)

    def sample_input(rng: random.Random) -> dict[str, Any]:
        while True:  # CausalAbstraction's filter: the question's colour among the choices, all values distinct
            x = {"question": rng.choice(color_objects), **{f"symbol{i}": rng.choice(ALPHABET) for i in range(4)},
                 **{f"choice{i}": rng.choice(colors) for i in range(4)}}
            values = [x[f"choice{i}"] for i in range(4)] + [x[f"symbol{i}"] for i in range(4)]
            if x["question"][0] in values[:4] and len(set(values)) == len(values):
                return x

    def sample(kind: str, rng: random.Random) -> tuple[dict, dict]:
        base = sample_input(rng)
        src = dict(base)
        if kind == "answerPosition":
            _move_answer(src, model.run(base)["answer_pointer"], rng, keyed=False)
        elif kind == "randomLetter":
            _new_letters(src, rng)
        else:  # answerPosition_randomLetter: a new sample with the base's question
            while True:
                src = {**sample_input(rng), "question": base["question"]}
                if model.run(src)["answer_pointer"] is not None:
                    break
        return base, src

    def render(x: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        color, obj = x["question"]
        head = f"Question: The {obj} is {color}. What color is the {obj}?"
        return _choice_render(head, x, [x[f"choice{i}"] for i in range(4)], model.run(x)["answer_pointer"])

    return Task("mcqa", *SPECS["mcqa"], model, render, sample, lambda s: s["answer"], _contains)


@MIB_TASKS.register("arc")
def arc(files: Mapping[str, Any]) -> Task:
    path = files.get("path")
    if not path:
        raise ConfigError("MIB task 'arc' reads ARC-Easy questions from a JSONL file: set its path "
                          "(mib.files.arc.path)")
    p = Path(path)
    if not p.is_file():
        raise DataError(f"MIB task 'arc': no file {p}")
    rows = []
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            labels, texts = list(r["choices"]["label"]), list(r["choices"]["text"])
            key = r["answerKey"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataError(f"MIB task 'arc': {p} line {i + 1} is no ARC row ({e})") from None
        if len(labels) == N_CHOICES:  # MIB keeps the four-choice questions
            rows.append((r.get("question", ""), texts, labels.index(key) if key in labels else int(key)))
    if not rows:
        raise DataError(f"MIB task 'arc': {p} has no question with four choices")
    model = _choice_model(question=False)

    def sample(kind: str, rng: random.Random) -> tuple[dict, dict]:
        q, texts, key = rng.choice(rows)
        base = {"question": q, "answerKey": key, **{f"choice{i}": t for i, t in enumerate(texts)},
                **{f"symbol{i}": ALPHABET[i] for i in range(N_CHOICES)}}
        src = dict(base)
        if kind in ("answerPosition", "answerPosition_randomLetter"):
            _move_answer(src, key, rng, keyed=True)
        if kind in ("randomLetter", "answerPosition_randomLetter"):
            _new_letters(src, rng)
        return base, src

    def render(x: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        return _choice_render(f"Question: {x['question']}", x, [x[f"choice{i}"] for i in range(N_CHOICES)],
                              x["answerKey"])

    return Task("arc", *SPECS["arc"], model, render, sample, lambda s: s["answer"], _contains)


# ----------------------------------------------------------------------------------------------- arithmetic
def _arithmetic_check(output: str, expected: str) -> bool:
    """MIB's arithmetic checker: the first number generated is the expected one (a leading zero may be left out)."""
    numbers = re.findall(r"\d+", output)
    if not numbers:
        return False
    return numbers[0] == expected or (expected.startswith("0") and numbers[0] == expected[1:])


@MIB_TASKS.register("arithmetic")
def arithmetic(files: Mapping[str, Any]) -> Task:
    digits = ("op1_tens", "op1_ones", "op2_tens", "op2_ones")
    model = CausalModel(
        [*digits, "ones_carry", "hundreds_out", "tens_out", "ones_out"],
        {"ones_carry": ("op1_ones", "op2_ones"), "ones_out": ("op1_ones", "op2_ones"),
         "tens_out": ("op1_tens", "op2_tens", "ones_carry"), "hundreds_out": ("op1_tens", "op2_tens", "ones_carry")},
        {"ones_carry": lambda a, b: int(a + b > 9), "ones_out": lambda a, b: (a + b) % 10,
         "tens_out": lambda a, b, c: (a + b + c) % 10, "hundreds_out": lambda a, b, c: int(a + b + c > 9)})

    def sample_input(rng: random.Random) -> dict[str, int]:  # two-digit operands (MIB keeps num_digit == 2)
        return {"op1_tens": rng.randint(1, 9), "op1_ones": rng.randint(0, 9), "op2_tens": rng.randint(1, 9),
                "op2_ones": rng.randint(0, 9)}

    def sample(kind: str, rng: random.Random) -> tuple[dict, dict]:
        if kind == "random":
            return sample_input(rng), sample_input(rng)
        while True:  # ones_carry: the ones digits changed so the carry flips (a ones sum of 9 cannot flip it)
            base = sample_input(rng)
            s = base["op1_ones"] + base["op2_ones"]
            if s != 9:
                break
        goal = s % 10 if s > 9 else s + 10
        first = rng.choice([a for a in range(10) if 0 <= goal - a <= 9])
        return base, {**base, "op1_ones": first, "op2_ones": goal - first}

    def render(x: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        return ([f"Q: How much is {x['op1_tens']}{x['op1_ones']} plus {x['op2_tens']}{x['op2_ones']}", "? A: "],
                ["op2_last", "rest"])

    return Task("arithmetic", *SPECS["arithmetic"], model, render, sample,
                lambda s: f"{s['hundreds_out']}{s['tens_out']}{s['ones_out']}", _arithmetic_check, max_new_tokens=3)


# ----------------------------------------------------------------------------------------------- IOI
IOI_KINDS = {"s1_io_flip": ("name_B", "name_A", "name_A"), "s2_io_flip": ("name_A", "name_B", "name_B"),
             "s1_ioi_flip_s2_ioi_flip": ("name_B", "name_A", "name_B")}
"""Each kind's source names (name_A, name_B, name_C) as the base's: a base is ``A … B … A gave … to`` (S1 = S2 = A,
the indirect object B)."""


@MIB_TASKS.register("ioi")
def ioi(files: Mapping[str, Any]) -> Task:
    names = _json(files.get("names", FILES / "ioi_names.json"), "IOI names")
    objects = _json(files.get("objects", FILES / "ioi_objects.json"), "IOI objects")
    places = _json(files.get("places", FILES / "ioi_places.json"), "IOI places")
    templates = _json(files.get("templates", FILES / "ioi_templates.json"), "IOI templates")
    model = CausalModel(
        ["name_A", "name_B", "name_C", "output_position", "output_token"],
        {"output_position": ("name_A", "name_B", "name_C"), "output_token": ("name_A", "name_B", "name_C")},
        {"output_position": lambda a, b, c: 1 if c == a else 0 if c == b else None,
         "output_token": lambda a, b, c: b if c == a else a if c == b else None})

    def sample(kind: str, rng: random.Random) -> tuple[dict, dict]:
        a, b = rng.sample(names, 2)
        base = {"name_A": a, "name_B": b, "name_C": a, "template": rng.choice(templates),
                "place": rng.choice(places), "object": rng.choice(objects)}
        who = IOI_KINDS[kind]
        return base, {**base, "name_A": base[who[0]], "name_B": base[who[1]], "name_C": base[who[2]]}

    def render(x: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        text = x["template"].format(name_A=x["name_A"], name_B=x["name_B"], name_C="{name_C}", place=x["place"],
                                    object=x["object"])
        head, tail = text.split("{name_C}")
        return [head + x["name_C"], tail], ["s2_name", "rest"]

    return Task("ioi", *SPECS["ioi"], model, render, sample, lambda s: " " + s["output_token"], _contains,
                notes=("MIB scores IOI at attention heads by the squared error of the IO-S logit difference under a "
                       "linear causal model; cprobe scores the raw output (the indirect object's name) at residual "
                       "stream sites, where output_position leaves the output unchanged",))


# ----------------------------------------------------------------------------------------------- RAVEL
RAVEL_ATTRIBUTES = ("Continent", "Country", "Language")
EDGE = re.compile(r"united states|united kingdom|czech republic", re.IGNORECASE)


def _ravel_check(output: str, expected: str) -> bool:
    """MIB's RAVEL checker: a comma-separated part of the expected value inside the output (lower case, punctuation
    dropped); the United States / Kingdom and South Korea's short forms count."""
    clean = re.sub(r"[^\w\s]+", "", output.lower()).strip()
    if any(part.strip().lower() in clean for part in expected.split(",")):
        return True
    if EDGE.search(expected):
        raw_e, raw_o = expected.strip().lower().replace("the ", ""), output.strip().lower().replace("the ", "")
        return raw_o.startswith(raw_e) or raw_o.startswith("england") or raw_o == "us"
    return "south korea" in expected.lower() and (clean.startswith("korea") or clean.startswith("south korea"))


@MIB_TASKS.register("ravel")
def ravel(files: Mapping[str, Any]) -> Task:
    path = files.get("cities")
    if not path:
        raise ConfigError("MIB task 'ravel' reads its cities from a JSON file (city -> Country, Continent, Language): "
                          "set mib.files.ravel.cities (e.g. ${paths.data_dir}/ravel/ravel_city_entity_attributes.json)")
    raw = _json(path, "RAVEL cities")
    cities = {c: v for c, v in sorted(raw.items()) if all(v.get(a) for a in RAVEL_ATTRIBUTES)}
    limit = files.get("n_cities")
    if limit:  # a seeded subset (small models know few cities)
        cities = dict(sorted(random.Random(f"cities/{limit}").sample(sorted(cities.items()), min(limit, len(cities)))))
    if len(cities) < 2:
        raise DataError(f"MIB task 'ravel': {path} has {len(cities)} city with {list(RAVEL_ATTRIBUTES)}; it needs two")
    names = sorted(cities)
    model = CausalModel(
        ["entity", "queried_attribute", *RAVEL_ATTRIBUTES, "answer"],
        {**{a: ("entity",) for a in RAVEL_ATTRIBUTES}, "answer": ("queried_attribute", *RAVEL_ATTRIBUTES)},
        {**{a: (lambda e, a=a: cities[e][a]) for a in RAVEL_ATTRIBUTES},
         "answer": lambda q, *vals: "" if q == "wikipedia" else vals[RAVEL_ATTRIBUTES.index(q)]})

    def sample(kind: str, rng: random.Random) -> tuple[dict, dict]:
        e, f = rng.sample(names, 2)
        base = {"entity": e, "queried_attribute": rng.choice(RAVEL_ATTRIBUTES)}
        query = "wikipedia" if kind == "wikipedia" else rng.choice(RAVEL_ATTRIBUTES)
        return base, {"entity": f, "queried_attribute": query}

    def render(x: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        q = x["queried_attribute"]
        head = "Q: What is " if q == "wikipedia" else f"Q: What is the {q.lower()} of "
        return [head, x["entity"], "? A:"], ["prefix", "entity_last_token", "rest"]

    return Task("ravel", *SPECS["ravel"], model, render, sample, lambda s: f" {s['answer']}" if s["answer"] else "",
                _ravel_check, max_new_tokens=2)


# ----------------------------------------------------------------------------------------------- a tiny LM's corpus
def task_files(task: str, files: Mapping[str, Any], data_root: Path | None) -> dict[str, Any]:
    """A task's file settings with relative paths read under ``data_root``."""
    out = dict(files or {})
    for k, v in out.items():
        if isinstance(v, str) and data_root is not None and not Path(v).is_absolute():
            out[k] = str(Path(data_root) / v)
    return out


def corpus(spec: Mapping[str, Any], data_root: Path) -> list[str]:
    """Sentences for a tiny LM that learns MIB's tasks (``tiny.mib_corpus`` of a model config): per task of
    ``spec["tasks"]`` (``{task: {n: …, <file settings>}}``), ``n`` prompts followed by their expected output — the
    bases and sources of pairs of every kind, seeded by ``spec["seed"]`` apart from the study's pairs (a source whose
    output is empty, RAVEL's ``wikipedia`` prompt, is left out)."""
    out: list[str] = []
    for name, node in (spec.get("tasks") or {}).items():
        node = dict(node or {})
        n = int(node.pop("n", 1000))
        task = build_task(name, task_files(name, node, data_root))
        rng = random.Random(f"corpus/{spec.get('seed', 0)}/{name}")
        while n > 0:
            for x in task.sample(rng.choice(task.kinds), rng):
                y = task.output(task.model.run(x))
                if y and n > 0:
                    out.append("".join(task.render(x)[0]) + y)
                    n -= 1
    return out
