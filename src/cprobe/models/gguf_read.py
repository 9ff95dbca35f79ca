"""transformers' GGUF loader at the speed of the file: the same values, without its three avoidable costs.

Dequantising a GGUF once (:func:`cprobe.models.gguf.dequantised`) runs transformers' loader three times over one file
(the config, the tokenizer, the weights), and each time:

- **gguf's reader parses every metadata field element by element** through ``numpy.memmap`` slices. A memmap slice
  goes through numpy's Python-level ``memmap.__array_finalize__``; Gemma 3's 262,144-token vocabulary (tokens, scores,
  token types) is ~800k of them per parse. Profiled on Gemma 3 270M (2026-11-29, 2-core AMD EPYC, load ~20), these
  parses were 68 % of the first load and the dequantisation 3 %.
- **the tensor-name map is rebuilt per module**: transformers asks ``gguf.get_tensor_name_map(arch, n_blocks)`` once
  per submodule of the model (~400 calls for SmolLM2), and each builds the same table.
- **the dequantisation runs 16 rows at a time** (gguf's ``_apply_over_grouped_rows``): 16k numpy rounds for Gemma's
  embedding matrix alone.

:func:`fast_reading` patches the ``gguf`` module for the duration of one build (transformers imports these names from
it at call time): ``GGUFReader`` becomes :class:`Reader`, one per file per build, whose fields are the reference
reader's part for part (same arrays, dtypes and shapes; arrays of scalars and strings read in one pass over a plain
ndarray); ``get_tensor_name_map`` is memoised per (architecture, blocks); ``dequantize`` is :func:`dequantize`, gguf's
own ``dequantize`` over many rows per numpy round, on the job's threads, which gives the reference's float32 values
bit for bit (every quantisation block is decoded on its own, so how rows are grouped changes nothing). transformers'
parser of each field value (run over all ~800k parts in each of the three passes) becomes :func:`value_parser`: the
same values, each part parsed once. ``tests/unit/test_gguf_read.py`` checks all four against their references.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from cprobe.compute import thread_budget

GROUP_VALUES = 1 << 22
"""Values one numpy round of :func:`dequantize` decodes (16 MB of float32): large enough that gguf's per-round Python
overhead vanishes, small enough that its temporaries stay in a few tens of MB per thread."""


@functools.cache
def reader_class() -> type:
    """:class:`Reader`, built on the installed ``gguf`` package's reader (imported on first use)."""
    import gguf
    from gguf import GGUFValueType

    class Reader(gguf.GGUFReader):
        """gguf's ``GGUFReader`` reading from a plain ndarray view of its memmap (numpy slices without memmap's
        Python-level bookkeeping), and arrays of scalars and strings in one pass; fields and tensors equal the
        reference reader's."""

        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = value.view(np.ndarray)

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[np.ndarray], list[int], list]:
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            item = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            offs, n = orig_offs + 12, int(count[0])
            itype = GGUFValueType(item[0])
            parts: list[np.ndarray] = [item, count]
            if n == 0:
                return offs - orig_offs, parts, [], [GGUFValueType.ARRAY]
            if itype == GGUFValueType.STRING:
                offs, idxs = self._strings(offs, n, parts)
            elif (nptype := self.gguf_scalar_to_np.get(itype)) is not None:
                block = self._get(offs, nptype, n)
                parts += [block[i:i + 1] for i in range(n)]
                idxs = list(range(2, 2 + n))
                offs += int(block.nbytes)
            else:  # arrays of arrays: the reference's element-by-element path
                return super()._get_field_parts(orig_offs, raw_type)
            return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, itype]

        def _strings(self, offs: int, n: int, parts: list[np.ndarray]) -> tuple[int, list[int]]:
            """``n`` strings from ``offs`` (each a uint64 length, then its bytes) appended to ``parts`` as the
            reference does (length, bytes); returns the end offset and the bytes' part indices."""
            data, order = self._data, "big" if self.byte_order == "S" else "little"
            u64 = np.dtype(np.uint64).newbyteorder(self.byte_order)
            u8 = np.dtype(np.uint8).newbyteorder(self.byte_order)
            raw = memoryview(data)
            idxs = []
            for _ in range(n):
                length = int.from_bytes(raw[offs:offs + 8], order)
                parts.append(data[offs:offs + 8].view(u64))
                idxs.append(len(parts))
                parts.append(data[offs + 8:offs + 8 + length].view(u8))
                offs += 8 + length
            return offs, idxs

    return Reader


def dequantize(data: np.ndarray, qtype: Any, reference: Any = None, threads: int | None = None) -> np.ndarray:
    """gguf's ``dequantize(data, qtype)`` (``reference``, default the installed one), bit for bit: its rows regrouped
    into rows of many rows each (a quantised row is whole blocks, decoded one by one), decoded in rounds of
    :data:`GROUP_VALUES` values, ``threads`` rounds at a time (default: the job's thread count,
    :func:`cprobe.compute.thread_budget`, whatever its passes run on at the moment)."""
    import gguf

    reference = reference or gguf.dequantize
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) or data.ndim < 2:
        return reference(data, qtype)
    rows = data.reshape(-1, data.shape[-1])
    values_per_row = rows.shape[1] // size * block
    per = max(1, GROUP_VALUES // (16 * values_per_row))  # gguf decodes 16 (re-grouped) rows per round
    n = len(rows)
    cut = n - n % per
    chunks = [(a, min(a + 16 * per, cut)) for a in range(0, cut, 16 * per)]
    out = np.empty((n, values_per_row), dtype=np.float32)

    def run(span: tuple[int, int]) -> None:
        a, b = span
        if b > a:
            out[a:b] = reference(rows[a:b].reshape(-1, per * rows.shape[1]), qtype).reshape(b - a, values_per_row)

    with ThreadPoolExecutor(max(1, threads or thread_budget())) as pool:
        list(pool.map(run, chunks))
    if cut < n:
        out[cut:] = reference(rows[cut:], qtype)
    return out.reshape(*data.shape[:-1], values_per_row)


_PATCH = threading.Lock()
_PARSE = "_gguf_parse_value"  # transformers' parser of one field value, as its GGUF loader names it


def value_parser(parse: Any) -> Any:
    """transformers' ``_gguf_parse_value(part, types)`` with the same results, faster: a string part (type 8, alone
    or in an array) decoded from its bytes at once (transformers builds a Python list of its bytes first), and each
    part parsed once per build (the reader is one per file, so a part is the same object in every pass; its value a
    str, int, float or bool)."""
    memo: dict[int, Any] = {}
    STRING, ARRAY = 8, 9

    def parsed(value: Any, types: Any) -> Any:
        key = id(value)
        if key not in memo:
            kinds = list(types) if isinstance(types, list) else [types]
            if kinds in ([STRING], [ARRAY, STRING]) and value.dtype == np.uint8:
                memo[key] = (value, value.tobytes().decode())
            else:
                memo[key] = (value, parse(value, types))
        return memo[key][1]

    return parsed


@contextmanager
def fast_reading() -> Iterator[None]:
    """Within the block, the ``gguf`` module's reader, tensor-name map and dequantiser are the fast ones (module doc):
    one :class:`Reader` per file, one name map per (architecture, blocks). Restored on exit; one block at a time."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as loader

    with _PATCH:
        saved = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map", "dequantize")}
        readers: dict[tuple[str, str], Any] = {}
        Reader = reader_class()

        def reader(path: Any, mode: str = "r") -> Any:
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = Reader(path, mode)
            return readers[key]

        reference = saved["dequantize"]
        gguf.GGUFReader = reader
        gguf.get_tensor_name_map = functools.cache(saved["get_tensor_name_map"])
        gguf.dequantize = lambda data, qtype: dequantize(data, qtype, reference)
        parse = loader.__dict__.get(_PARSE)
        if parse is not None:
            setattr(loader, _PARSE, value_parser(parse))
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(gguf, name, value)
            if parse is not None:
                setattr(loader, _PARSE, parse)
