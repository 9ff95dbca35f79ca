"""The start token a causal LM's every input begins with (``model.bos``), the same in every study.

- ``auto``: the tokenizer's BOS token, unless it is a chat turn marker (it opens a turn inside the chat template's
  loop over messages, as SmolLM2's ``<|im_start|>`` does): then the document separator — the EOS token, or, when
  that is a turn marker too (``<|im_end|>``), ``<|endoftext|>`` when the vocabulary has it. A tokenizer with neither
  is a one-line error naming the two other settings.
- ``none``: no start token.
- any other string: that token (one token of the vocabulary, else a one-line error).

Masked LMs and encoders keep their tokenizer's own special tokens ([CLS] … [SEP]): for them only ``auto`` is
accepted. The formatters tokenise a causal LM's texts without the tokenizer's special tokens and put this token first
(:mod:`cprobe.models.formatters`), so a tokenizer that adds a BOS and one that does not are read alike.
"""

from __future__ import annotations

from typing import Any

from cprobe.errors import ConfigError

AUTO, NONE = "auto", "none"
SEPARATOR = "<|endoftext|>"
"""The document separator looked for when the EOS token is a chat turn marker (GPT-2's, SmolLM's, Qwen's)."""


def check_setting(bos: str, kind: str, name: str) -> None:
    """A one-line error for a start token set on a model whose inputs are not a causal LM's."""
    if bos != AUTO and kind not in ("causal", "auto"):
        raise ConfigError(f"model {name!r}: model.bos={bos!r} applies to causal LMs, and this is a {kind} model "
                          "(its tokenizer's own special tokens are used); drop model.bos")


def turn_marker(tok: Any, token: str) -> bool:
    """Whether ``token`` opens or closes a chat turn: it appears inside the chat template's loop over messages."""
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or not token:
        return False
    loop = template.find("for message in")
    return loop >= 0 and token in template[loop:]


def start_token(tok: Any, bos: str, kind: str, name: str) -> str | None:
    """The start token of model ``name`` for setting ``bos`` (module doc); None: none (or not a causal LM)."""
    check_setting(bos, kind, name)
    if kind != "causal" or bos == NONE:
        return None
    if bos != AUTO:
        ids = tok.convert_tokens_to_ids([bos])
        if not ids or ids[0] is None or (ids[0] == tok.unk_token_id and bos != tok.unk_token):
            raise ConfigError(f"model {name!r}: model.bos={bos!r} is not a token of its vocabulary; set one of its "
                              f"special tokens {list(dict.fromkeys(tok.all_special_tokens))[:8]}, auto or none")
        return bos
    for candidate in (tok.bos_token, tok.eos_token):
        if candidate and not turn_marker(tok, candidate):
            return str(candidate)
    vocab = tok.get_vocab()
    if SEPARATOR in vocab and not turn_marker(tok, SEPARATOR):
        return SEPARATOR
    raise ConfigError(f"model {name!r}: its tokenizer has no BOS token and no document separator "
                      f"(BOS {tok.bos_token!r}, EOS {tok.eos_token!r}); set model.bos=none to start inputs with their "
                      "first word, or model.bos=TOKEN")


def token_id(tok: Any, token: str | None) -> int | None:
    """The id of the start token (None: none)."""
    return None if token is None else int(tok.convert_tokens_to_ids(token))
