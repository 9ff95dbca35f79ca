"""Readouts: what a model's output is read as, one (n, k) tensor per batch.

- :class:`CandidateTokens`: the logits (n, k) of per-row candidate tokens at the prediction position — the agreement
  studies' (correct, wrong) verbs, CausalGym's (y_b, y_s) labels, RAVEL's attribute values; with ``normalise=True``
  their log-probabilities over the whole vocabulary;
- :class:`Verbaliser`: the same with one fixed set of label words for every row (an LM used as a
  classifier through a prompt);
- :class:`Vocabulary`: the full next-token / masked-token log-distribution (n, V);
- :class:`NextToken`: the same, unchecked, for a forward that runs every training step;
- :class:`TargetLogProb`: each row's target token's log-probability (n, 1) (DAS's loss at many sites);
- :class:`TopK`: the ids (n, k) of the k most probable tokens (cloze probing: P@1 after stop-word skipping);
- :class:`ClassHead`: a sequence classifier's class log-probabilities (n, C);
- :class:`GreedyTokens`: the most probable token (n, m) at each of m named positions (teacher-forced continuations,
  :class:`~cprobe.models.formatters.ContinuationFormatter`: greedy decoding's answer, RAVEL's metric);
- :class:`ContinuationLogProb`: a teacher-forced continuation's log-probability as a two-way distribution (n, 2)
  (DAS's loss on a multi-token label).

**The normaliser.** log p(t) = logit(t) − log Σ_v exp logit(v): the log-sum-exp is one number per row, so every
comparison between a row's candidates cancels it — a difference (CausalGym's log odds-ratio, eq. 9, its IIA and
erasure), an argmax (RAVEL's answer, a verbaliser's class, task accuracy). Those readouts read the candidates' logits
only (:meth:`Readout.token_ids`), and the adapter computes only those rows of the LM head
(:mod:`cprobe.models.head`). The metrics that need the normaliser read every row of the head: DAS's loss (CausalGym eq.
12, the log-probability of the source label over the vocabulary: :class:`TargetLogProb`, and a multi-token label's
:class:`ContinuationLogProb`), a spliced SAE's next-token loss and KL (:mod:`cprobe.sae.splice`), and a caller that
wants log-probabilities (``CandidateTokens(ids, normalise=True)``). Where a readout names its tokens and needs their
log-probabilities (:attr:`Readout.normalise`: :class:`TargetLogProb`, normalised candidates), the adapter streams the
head once for their rows and the normaliser together (:meth:`Head.log_probs <cprobe.models.head.Head.log_probs>`),
without the (n, V) logits; the top-k needs every logit but no normaliser.

"Task accuracy" is a readout method (:meth:`Readout.accuracy`). A readout's :meth:`spec` enters the
activation-cache key, so cached scores are never read back under another readout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.models.sites import Batch


class Readout(ABC):
    """Scores of each row of a batch from the model's logits."""

    name: ClassVar[str]
    at_position: ClassVar[bool] = True
    """True when the readout reads token logits at the batch's prediction position (LM heads)."""

    def spec(self) -> dict[str, Any]:
        """A JSON-able identity for cache keys."""
        return {"readout": self.name}

    @abstractmethod
    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        """(n, k) scores from the model's logits for ``batch``: (n, T, V) for LMs, (n, C) for classifiers."""

    normalise: bool = False
    """True when the scores of :meth:`token_ids` are their log-probabilities over the whole vocabulary: the adapter
    then gives :meth:`from_token_logits` :meth:`Head.log_probs <cprobe.models.head.Head.log_probs>` (those rows and
    the normaliser, in one streamed read of the head) instead of the rows' logits."""

    def token_ids(self, batch: Batch) -> Tensor | None:
        """The token ids (n, k) whose logits (or, :attr:`normalise`, log-probabilities) at the prediction position are
        all this readout reads of ``batch``; None when it reads more of the vocabulary (a top-k). Given ids, the
        adapter computes those rows of the LM head only (:mod:`cprobe.models.head`) and scores them with
        :meth:`from_token_logits`."""
        return None

    def from_token_logits(self, logits: Tensor, batch: Batch) -> Tensor:
        """(n, k) scores from the logits (n, k) of the tokens :meth:`token_ids` named, as the model computes them
        (their log-probabilities where :attr:`normalise`)."""
        raise NotImplementedError(f"the {self.name} readout reads the whole vocabulary")

    def predict(self, scores: Tensor) -> Tensor:
        """The predicted column per row."""
        return scores.argmax(-1)

    def accuracy(self, scores: Tensor, gold: Tensor | None = None) -> float:
        """Share of rows whose best-scored column is ``gold``; without ``gold``, the task accuracy (column 0 is the
        correct candidate: :func:`task_accuracy`)."""
        if scores.numel() == 0:
            raise ConfigError("accuracy of an empty set of rows is undefined")
        if gold is None:
            return float(task_accuracy(scores))  # type: ignore[arg-type]
        return float((self.predict(scores.cpu()) == gold.to(torch.long).cpu()).double().mean())


def task_accuracy(scores: Tensor | None) -> float | None:
    """The task accuracy of candidate scores (n, k) whose column 0 is the correct candidate: the share of rows where
    it scores strictly above every other column (a tie counts as wrong; CausalGym's p(y_b|b) > p(y_s|b)). None
    without scores (a model with no output head); NaN for no rows. The one definition every study uses."""
    if scores is None:
        return None
    scores = scores.detach().cpu()
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise ConfigError(f"task accuracy needs (n, k >= 2) candidate scores, got {tuple(scores.shape)}")
    return float((scores[:, 0] > scores[:, 1:].max(1).values).double().mean())


def logits_at(logits: Tensor, batch: Batch) -> Tensor:
    """Token logits (n, V) at each row's prediction position."""
    pos = batch.pred_positions().to(logits.device)
    if bool((pos < 0).any()):
        raise ConfigError("some rows have no prediction position")
    return logits[torch.arange(len(pos), device=logits.device), pos]


class CandidateTokens(Readout):
    """Scores (n, k) of per-item candidate token ids ``ids`` (N, k) at the prediction position: their logits, as the
    model computes them (the final norm, a masked LM's head transform and any soft cap included), from those rows of
    the head only — for comparisons between a row's candidates, where the normaliser cancels (module doc); with
    ``normalise``, their log-probabilities over the whole vocabulary (the rows and the streamed normaliser)."""

    name = "candidates"

    def __init__(self, ids: Tensor | Sequence[Sequence[int]], normalise: bool = False) -> None:
        self.ids = torch.as_tensor(ids, dtype=torch.long)
        if self.ids.ndim != 2 or self.ids.shape[1] < 1:
            raise ConfigError(f"candidate ids must be (n_items, k), got shape {tuple(self.ids.shape)}")
        self.normalise = bool(normalise)

    def spec(self) -> dict[str, Any]:
        # the ids are a function of the items and the tokenizer, both already in the cache key
        return {"readout": self.name, "k": int(self.ids.shape[1]), **self._kind()}

    def _kind(self) -> dict[str, Any]:
        return {} if self.normalise else {"scores": "logits"}  # log-probs: the spec they were cached under

    def _ids(self, batch: Batch) -> Tensor:
        return self.ids[batch.rows.to(self.ids.device)]

    def token_ids(self, batch: Batch) -> Tensor | None:
        return self._ids(batch)

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        at = logits_at(logits, batch).float()
        if self.normalise:
            at = at.log_softmax(-1)
        return at.gather(1, self._ids(batch).to(at.device))

    def from_token_logits(self, logits: Tensor, batch: Batch) -> Tensor:
        if bool((batch.pred_positions() < 0).any()):
            raise ConfigError("some rows have no prediction position")
        return logits.float()


class Verbaliser(CandidateTokens):
    """The same scores of fixed label words (one token id per class) at the prediction position."""

    name = "verbaliser"

    def __init__(self, label_ids: Sequence[int], normalise: bool = False) -> None:
        self.label_ids = [int(i) for i in label_ids]
        if len(self.label_ids) < 2:
            raise ConfigError("a verbaliser needs at least two label words")
        super().__init__([self.label_ids], normalise)

    def spec(self) -> dict[str, Any]:
        return {"readout": self.name, "label_ids": self.label_ids, **self._kind()}

    def _ids(self, batch: Batch) -> Tensor:
        return self.ids.expand(len(batch.rows), -1)


class Vocabulary(Readout):
    """The full log-distribution (n, V) at the prediction position."""

    name = "vocabulary"

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        return logits_at(logits, batch).float().log_softmax(-1)


class NextToken(Readout):
    """The next-token log-distribution (n, V) at the prediction position, with no check that reads the device (DAS
    trains through it every step; the rows are known to have the position)."""

    name = "next_token"

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        pos = batch.positions[str(batch.pred)].to(logits.device)
        return logits[torch.arange(len(pos), device=logits.device), pos].float().log_softmax(-1)


class TargetLogProb(CandidateTokens):
    """Each item's own target token's log-probability over the whole vocabulary at the prediction position (n, 1):
    DAS's loss (CausalGym eq. 12: ``targets`` (N,) the items' source labels; a DAS step's batch numbers its K·b rows
    0 … K·b − 1) — normalised candidates of one token per item, from the head's target rows and its streamed
    normaliser (:meth:`Head.log_probs <cprobe.models.head.Head.log_probs>`), or from the full logits where the head is
    not split. Unlike :class:`CandidateTokens` it checks no row's position, so nothing is read back from the device
    (it runs every training step), and its cache key holds its targets (they are not a function of the items)."""

    name = "target_logprob"

    def __init__(self, targets: Tensor) -> None:
        targets = torch.as_tensor(targets, dtype=torch.long)
        if targets.ndim != 1:
            raise ConfigError(f"target ids must be (n,), got shape {tuple(targets.shape)}")
        super().__init__(targets[:, None], normalise=True)

    def spec(self) -> dict[str, Any]:
        import hashlib

        digest = hashlib.sha256(self.ids.cpu().numpy().tobytes()).hexdigest()[:16]
        return {"readout": self.name, "targets": digest}

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        pos = batch.positions[str(batch.pred)].to(logits.device)
        at = logits[torch.arange(len(pos), device=logits.device), pos].float().log_softmax(-1)
        return at.gather(1, self._ids(batch).to(at.device))

    def from_token_logits(self, logits: Tensor, batch: Batch) -> Tensor:
        return logits.float()


class TopK(Readout):
    """Ids (n, k) of the ``k`` most probable tokens at the prediction position, best first."""

    name = "topk"

    def __init__(self, k: int = 10) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"top-k needs an integer k >= 1, got {k!r}")
        self.k = k

    def spec(self) -> dict[str, Any]:
        return {"readout": self.name, "k": self.k}

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        return logits_at(logits, batch).float().topk(self.k, dim=-1).indices

    def predict(self, scores: Tensor) -> Tensor:
        return scores[:, 0]

    def accuracy(self, scores: Tensor, gold: Tensor | None = None) -> float:
        """P@1: share of rows whose top token is the gold token id."""
        if gold is None:
            raise ConfigError("top-k accuracy needs the gold token ids")
        return float((scores[:, 0].cpu() == gold.cpu()).float().mean())


class GreedyTokens(Readout):
    """The argmax token ids (n, m) at the named positions ``positions`` (−1 where a row lacks one): on a teacher-
    forced continuation (``answer:0`` … ``answer:m−1``), greedy decoding writes the continuation's first m tokens
    exactly when every row entry equals that continuation token — one forward instead of m decoding steps. The
    adapter computes the head at these positions only (``at_positions``)."""

    name = "greedy_tokens"
    at_position = False

    def __init__(self, positions: Sequence[str]) -> None:
        self.positions = tuple(positions)
        if not self.positions:
            raise ConfigError("greedy tokens need at least one position")

    @property
    def at_positions(self) -> tuple[str, ...]:
        """The positions whose logits this readout reads (the adapter's head sees those tokens only)."""
        return self.positions

    def spec(self) -> dict[str, Any]:
        return {"readout": self.name, "positions": list(self.positions)}

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        out = []
        for name in self.positions:
            pos = batch.position(name).to(logits.device)
            best = logits[rows, pos.clamp(min=0)].argmax(-1)
            out.append(torch.where(pos >= 0, best, torch.full_like(best, -1)))
        return torch.stack(out, 1)

    def predict(self, scores: Tensor) -> Tensor:
        return scores[:, 0]


class ContinuationLogProb(GreedyTokens):
    """The log-probability lp of each row's continuation ``targets`` (n, m; −1 pads) read at the named positions, as
    the two-way log-distribution (n, 2) ``[lp, log(1 − e^lp)]``: a cross-entropy on class 0 is −lp, the continuation's
    loss summed over its tokens (what :meth:`cprobe.directions.das.DAS.fit_many` minimises, unchanged, on a label of
    several tokens). lp is capped at −1e-6 so the complement stays finite."""

    name = "continuation_logprob"
    normalise = True  # :meth:`token_ids` are the targets, one per position: their rows and the streamed normaliser

    def __init__(self, positions: Sequence[str], targets: Tensor) -> None:
        super().__init__(positions)
        self.targets = torch.as_tensor(targets, dtype=torch.long)
        if self.targets.ndim != 2 or self.targets.shape[1] != len(self.positions):
            raise ConfigError(f"continuation targets must be (n, {len(self.positions)}), got "
                              f"{tuple(self.targets.shape)}")

    def spec(self) -> dict[str, Any]:
        return {"readout": self.name, "positions": list(self.positions)}

    def token_ids(self, batch: Batch) -> Tensor | None:
        """The target token at each named position (n, m) (a pad's −1 read as token 0, then left out)."""
        return self.targets.clamp(min=0)

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        tgt = self.targets.to(logits.device).clamp(min=0)
        steps = [logits[rows, batch.position(name).to(logits.device).clamp(min=0)].float().log_softmax(-1)
                 .gather(1, tgt[:, j:j + 1])[:, 0] for j, name in enumerate(self.positions)]
        return self.from_token_logits(torch.stack(steps, 1), batch)

    def from_token_logits(self, logits: Tensor, batch: Batch) -> Tensor:
        """From each position's target log-probability (n, m): their sum over the real positions and tokens."""
        tgt = self.targets.to(logits.device)
        lp = torch.zeros(logits.shape[0], device=logits.device)
        for j, name in enumerate(self.positions):
            pos = batch.position(name).to(logits.device)
            step = logits[:, j].float()
            lp = lp + torch.where((pos >= 0) & (tgt[:, j] >= 0), step, torch.zeros_like(step))
        lp = lp.clamp(max=-1e-6)
        return torch.stack([lp, torch.log(-torch.expm1(lp))], 1)

    def predict(self, scores: Tensor) -> Tensor:
        return scores.argmax(-1)


class ClassHead(Readout):
    """A sequence classifier's class log-probabilities (n, C)."""

    name = "class_head"
    at_position = False

    def scores(self, logits: Tensor, batch: Batch) -> Tensor:
        if logits.ndim != 2:
            raise ConfigError("the class_head readout needs a sequence-classification model (logits (n, C))")
        return logits.float().log_softmax(-1)
