"""Row readers shared by the file-based datasets: TSV/CSV/JSONL with file:line error messages."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

from cprobe.errors import DataError

FORMATS = ("tsv", "csv", "jsonl")
QUOTING = ("csv", "none")
EXTENSIONS = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def require_file(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise DataError(
            f"dataset {dataset!r}: file {path} not found; run `cprobe data` for where to get it, "
            f"and point CPROBE_DATA_DIR (or paths.data_dir=...) at the folder that holds it"
        )
    return path


def read_text(path: Path) -> str:
    """The file's text; invalid UTF-8 is a DataError naming the line and the byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x}); re-save the file as UTF-8")


def read_rows(path: Path, fmt: str = "auto", quoting: str = "csv") -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row dict). Malformed lines raise DataError naming file and line.

    ``quoting="csv"`` reads standard CSV/TSV quoting (a field in double quotes may hold the delimiter and
    doubled quotes, as pandas and spreadsheets write them); ``"none"`` takes every character literally.
    """
    if fmt == "auto":
        fmt = EXTENSIONS.get(path.suffix.lower(), "")
    if fmt not in FORMATS:
        raise DataError(f"{path}: cannot tell the format from {path.suffix!r}; set dataset.format to one of "
                        f"{list(FORMATS)}")
    if quoting not in QUOTING:
        raise DataError(f"unknown quoting {quoting!r}; choose from {list(QUOTING)}")
    text = read_text(path)
    if not text.strip():
        raise DataError(f"{path} is empty; it needs one row per item")
    if fmt == "jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: malformed JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{n}: expected a JSON object per line")
            yield n, row
        return
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if fmt == "tsv" else ",",
                        quoting=csv.QUOTE_NONE if quoting == "none" else csv.QUOTE_MINIMAL, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file")
        for cells in reader:
            n = reader.line_num
            if not cells or not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise DataError(f"{path}:{n}: expected {len(header)} columns ({', '.join(header)}), got {len(cells)}"
                                + ("; an unbalanced double quote? set dataset.quoting=none for raw text"
                                   if quoting == "csv" and '"' in "".join(cells) else ""))
            yield n, dict(zip(header, cells))
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: {e}; set dataset.quoting=none if quotes are literal text") from None
