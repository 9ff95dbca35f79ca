"""Tiny GGUF files with random weights and a tokenizer, written by the tests with the ``gguf`` package (no download):
a Llama (byte-level BPE tokenizer, as GPT-2's) and a Gemma 3 (sentencepiece tokenizer), a few tensors quantised to
Q8_0 so that the file is a quantised one as a real GGUF is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

WORDS = ("the", "keys", "key", "to", "cabinet", "is", "are", "on", "table", "author", "authors", "that", "near", "a",
         "dog", "dogs", "runs", "run", "he", "she", "they", "was", "were", "Mary", "John")
D, FF, LAYERS, HEADS, KV, HEAD_DIM = 64, 128, 3, 4, 2, 16  # Q8_0 quantises rows in blocks of 32 values


def _bpe_vocab() -> tuple[list[str], list[str]]:
    """Byte-level BPE tokens (GPT-2's byte alphabet) and merges: every byte, then each word with a leading space
    built by merging left to right."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *alphabet]
    merges: list[str] = []
    seen = set(tokens)
    for w in WORDS:
        piece = "Ġ"
        for ch in w:
            new = piece + ch
            if new not in seen:
                merges.append(f"{piece} {ch}")
                tokens.append(new)
                seen.add(new)
            piece = new
    return tokens, merges


def _sp_vocab() -> list[str]:
    """Sentencepiece tokens (Gemma's layout: pad, eos, bos, unk, then pieces, ``▁`` for a space)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "▁"]
    tokens += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    seen = set(tokens)
    for w in WORDS:
        piece = "▁"
        for ch in w:
            piece += ch
            if piece not in seen:
                tokens.append(piece)
                seen.add(piece)
    return tokens


def _quantised(writer, name: str, a: np.ndarray, quantise: bool) -> None:
    import gguf

    if quantise:
        q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        writer.add_tensor(name, a.astype(np.float32))


def _writer(path: Path, arch: str, eps: float) -> Any:
    """A GGUF writer for ``arch`` with the shape every tiny test model shares (3 layers of width D)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(eps)
    return w


def _weights(w: Any, rng: np.random.Generator, V: int, norms: tuple[tuple[str, int], ...]) -> Any:
    """The embeddings, each block's attention and gated-MLP matrices (quantised to Q8_0) and its ``norms`` (name,
    width), and the final norm, drawn from ``rng``; returns the draw for what a model adds (its head)."""
    def r(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.2, shape)

    w.add_tensor("token_embd.weight", r(V, D).astype(np.float32))
    for i in range(LAYERS):
        b = f"blk.{i}."
        for name, shape in (("attn_q", (HEADS * HEAD_DIM, D)), ("attn_k", (KV * HEAD_DIM, D)),
                            ("attn_v", (KV * HEAD_DIM, D)), ("attn_output", (D, HEADS * HEAD_DIM)),
                            ("ffn_gate", (FF, D)), ("ffn_up", (FF, D)), ("ffn_down", (D, FF))):
            _quantised(w, f"{b}{name}.weight", r(*shape), True)
        for norm, n in norms:
            w.add_tensor(f"{b}{norm}.weight", (1 + r(n)).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + r(D)).astype(np.float32))
    return r


def write_llama(path: Path, seed: int = 0, bos: str = "<|im_start|>", chat: bool = True) -> Path:
    """A 3-layer Llama GGUF with a byte-level BPE tokenizer whose BOS is ``bos`` (SmolLM2's layout by default: the
    chat turn marker as BOS, ``<|im_end|>`` as EOS, ``<|endoftext|>`` the document separator)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, merges = _bpe_vocab()
    V = len(tokens)
    w = _writer(path, "llama", 1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (V - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    if chat:
        w.add_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")

    r = _weights(w, rng, V, (("attn_norm", D), ("ffn_norm", D)))
    _quantised(w, "output.weight", r(V, D), True)
    _write(w)
    return path


def write_gemma3(path: Path, seed: int = 0, window: int = 8) -> Path:
    """A 3-layer Gemma 3 GGUF (sliding-window layers of width ``window`` and one global layer, as Gemma 3's 5:1
    pattern cut short) with a sentencepiece tokenizer that adds ``<bos>``; tied head."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = _sp_vocab()
    V = len(tokens)
    w = _writer(path, "gemma3", 1e-6)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(window)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types([gguf.TokenType.CONTROL] * 6 + [gguf.TokenType.NORMAL] * (V - 6))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)

    _weights(w, rng, V, (("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM), ("attn_norm", D),
                         ("post_attention_norm", D), ("ffn_norm", D), ("post_ffw_norm", D)))
    _write(w)
    return path


def _write(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
