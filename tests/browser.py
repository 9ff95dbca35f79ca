"""Open a page in headless Chromium and report what a reader would see wrong: console errors, uncaught exceptions,
failed or external requests, broken images, empty tables — plus a full-page screenshot.

Chromium is driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``: fds 3 and 4 of the browser,
NUL-separated JSON messages), so no client library is needed. Debian's ``chromium`` package (``.ci/run`` installs
it); ``CPROBE_CHROMIUM`` names another binary.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe")

CHECK_JS = r"""(() => {
  const imgs = [...document.images];
  const broken = imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt || i.src.slice(0, 60));
  const tables = [...document.querySelectorAll('table')];
  const label = t => (t.caption && t.caption.textContent) || t.outerHTML.slice(0, 120);
  const empty = tables.filter(t => t.querySelectorAll('thead th').length === 0
      || [...t.tBodies].reduce((n, b) => n + b.rows.length, 0) === 0).map(label);
  const external = [...document.querySelectorAll('[src],[href]')]
      .map(e => e.getAttribute('src') || e.getAttribute('href'))
      .filter(u => /^(https?:|ftp:|\/\/)/i.test(u));
  return {title: document.title, images: imgs.length, broken, tables: tables.length, empty, external,
          sections: [...document.querySelectorAll('section h2')].map(h => h.textContent),
          text: document.body.innerText.length};
})()"""


def chromium() -> str | None:
    """The Chromium binary, or None."""
    env = os.environ.get("CPROBE_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageCheck:
    """What the browser saw."""

    url: str
    page: dict[str, Any] = field(default_factory=dict)  # CHECK_JS's result
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    failed: list[str] = field(default_factory=list)
    screenshot: bytes = b""

    @property
    def network(self) -> list[str]:
        """Requests that left the machine (anything but file:, data:, about:)."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:", "chrome:"))]

    def problems(self) -> list[str]:
        out = [f"console error: {m}" for m in self.console_errors]
        out += [f"uncaught exception: {m}" for m in self.exceptions]
        out += [f"network request: {u}" for u in self.network]
        out += [f"failed to load: {u}" for u in self.failed]
        out += [f"broken image: {b}" for b in self.page.get("broken", [])]
        out += [f"empty table: {t}" for t in self.page.get("empty", [])]
        out += [f"external reference: {u}" for u in self.page.get("external", [])]
        return out


class _Pipe:
    def __init__(self, binary: str, profile: str) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fds 3 (commands in) and 4 (messages out)
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=fds, pass_fds=(3, 4))
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._next(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, name: str, session: str | None, timeout: float = 60.0) -> dict[str, Any]:
        for m in self.events:
            if m.get("method") == name and m.get("sessionId") == session:
                return m
        deadline = time.monotonic() + timeout
        while True:
            m = self._next(deadline)
            self.events.append(m)
            if m.get("method") == name and m.get("sessionId") == session:
                return m

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._next(deadline))
        except TimeoutError:
            pass

    def _next(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from Chromium")
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise RuntimeError(f"Chromium closed the pipe (exit {self.proc.poll()}): {err}")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()


class Browser:
    """One headless Chromium (a fresh profile) for several pages: ``with Browser() as b: b.check(path)``."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or chromium()
        if self.binary is None:
            raise RuntimeError("no Chromium found (apt-get install -y chromium, or set CPROBE_CHROMIUM)")

    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="cprobe-chromium-")
        self.pipe = _Pipe(self.binary, self._profile.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.pipe.close()
        self._profile.cleanup()

    def check(self, path: Path, width: int = 1400, max_height: int = 12000, settle: float = 0.3) -> PageCheck:
        """Load ``path`` (a local HTML file) in a new tab and check it."""
        pipe = self.pipe
        url = Path(path).resolve().as_uri()
        out = PageCheck(url)
        start = len(pipe.events)
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                             "mobile": False}, session=session)
            pipe.send("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired", session)
            pipe.drain(settle)
            res = pipe.send("Runtime.evaluate", {"expression": CHECK_JS, "returnByValue": True}, session=session)
            out.page = res.get("result", {}).get("value", {}) or {}
            metrics = pipe.send("Page.getLayoutMetrics", session=session)
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            clip = {"x": 0, "y": 0, "width": min(float(size.get("width", width)), 4000.0),
                    "height": min(float(size.get("height", 900)), float(max_height)), "scale": 1}
            shot = pipe.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True,
                                                         "optimizeForSpeed": True}, session=session)
            out.screenshot = base64.b64decode(shot.get("data", ""))
        finally:
            pipe.send("Target.closeTarget", {"targetId": target})
        _collect(out, [m for m in pipe.events[start:] if m.get("sessionId") == session])
        return out


def check_page(path: Path, binary: str | None = None, **kw: Any) -> PageCheck:
    """Load ``path`` in a fresh headless Chromium and check it."""
    with Browser(binary) as b:
        return b.check(path, **kw)


def _collect(out: PageCheck, events: list[dict[str, Any]]) -> None:
    for m in events:
        method, p = m.get("method"), m.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.console_errors.append(f"{e.get('text', '')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            out.requests.append(p.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            out.failed.append(f"{p.get('errorText', '')} ({p.get('type', '')})")
