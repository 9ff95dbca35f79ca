"""Static checks that catch what a merge can silently break: a name used but never defined or imported (e.g. a
module-level ``import`` dropped on one branch while another branch added a use of it). pyflakes reads the source
without importing it, so every module is checked, including code paths no other test reaches."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FATAL = ("undefined name", "undefined local variable", "syntax error", "invalid syntax", "is not defined")


def test_no_undefined_names():
    from pyflakes.api import checkPath
    from pyflakes.reporter import Reporter

    class Collect(Reporter):
        def __init__(self) -> None:
            self.found: list[str] = []

        def unexpectedError(self, filename, msg):  # noqa: N802 (pyflakes' API)
            self.found.append(f"{filename}: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802
            self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

        def flake(self, message):
            text = str(message)
            if any(f in text for f in FATAL):
                self.found.append(text)

    rep = Collect()
    files = sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").rglob("*.py"), *(ROOT / "tests").rglob("*.py")])
    assert files
    for f in files:
        checkPath(str(f), rep)
    assert rep.found == [], "\n".join(rep.found)


def test_the_check_sees_an_undefined_name(tmp_path):
    """The check itself can fail: a module using ``tempfile`` without importing it is reported."""
    from pyflakes.api import checkPath
    from pyflakes.reporter import Reporter

    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return tempfile.mkdtemp()\n")
    seen: list[str] = []

    class R(Reporter):
        def __init__(self) -> None:
            pass

        def flake(self, message):
            seen.append(str(message))

    checkPath(str(bad), R())
    assert any("undefined name 'tempfile'" in s for s in seen)


if __name__ == "__main__":
    pytest.main([__file__])
