"""Row readers shared by the file-based datasets: TSV/CSV/JSONL with file:line error messages."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from cprobe.errors import DataError

FORMATS = ("tsv", "csv", "jsonl")


def require_file(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise DataError(
            f"dataset {dataset!r}: file {path} not found; run `cprobe data` for where to get it, "
            f"and point CPROBE_DATA_DIR (or paths.data_dir=...) at the folder that holds it"
        )
    return path


def read_rows(path: Path, fmt: str = "auto") -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row dict). Malformed lines raise DataError naming file and line."""
    if fmt == "auto":
        fmt = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix, "")
    if fmt not in FORMATS:
        raise DataError(f"{path}: cannot tell the format; set dataset.format to one of {list(FORMATS)}")
    with path.open(encoding="utf-8", newline="") as f:
        if fmt == "jsonl":
            for n, line in enumerate(f, 1):
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
        reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",",
                            quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file")
        for n, cells in enumerate(reader, 2):
            if not cells:
                continue
            if len(cells) != len(header):
                raise DataError(f"{path}:{n}: expected {len(header)} columns ({', '.join(header)}), got {len(cells)}")
            yield n, dict(zip(header, cells))
