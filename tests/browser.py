"""Headless Chromium driven over the DevTools protocol, through ``--remote-debugging-pipe``
(JSON messages ending in NUL on fds 3 and 4: no port, no WebSocket library)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


class BrowserError(RuntimeError):
    """Chromium is missing, died, or a page did not get where it was asked to."""


class Chromium:
    """One headless page: ``navigate``, ``evaluate`` (JavaScript), ``wait_for``, ``screenshot``."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            raise BrowserError("chromium is missing: run scripts/setup-host.sh (make test does)")
        self._profile = tempfile.mkdtemp(prefix="otel-gil-chromium-")
        to_chrome, from_chrome = os.pipe(), os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4: moved there in the child
        # from numbers above 4, so that neither dup2 clobbers the other's source.
        theirs = [fcntl.fcntl(to_chrome[0], fcntl.F_DUPFD, 10), fcntl.fcntl(from_chrome[1], fcntl.F_DUPFD, 10)]
        for fd in (to_chrome[0], from_chrome[1]):
            os.close(fd)

        def fds_3_and_4() -> None:
            os.dup2(theirs[0], 3)
            os.dup2(theirs[1], 4)

        self._proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"],
            preexec_fn=fds_3_and_4, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for fd in theirs:
            os.close(fd)
        self._out, self._in = to_chrome[1], from_chrome[0]
        self._buffer, self._next_id = b"", 0
        target = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict:
        """Send one DevTools command (to the page once attached) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if getattr(self, "_session", None):
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buffer:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise BrowserError(f"no answer to {method} (chromium exit status {self._proc.poll()})")
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium closed its pipe during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._next_id:  # events and other answers are not ours
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer["result"]

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout} s waiting for: {expression}")
            time.sleep(0.25)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page as it is now."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        for fd in (self._out, self._in):
            os.close(fd)
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
