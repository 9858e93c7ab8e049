"""Headless Chromium driven over the DevTools protocol on a pipe: for the report's browser test and its screenshot.

No browser download and no driver package: Debian's `chromium` is started with `--remote-debugging-pipe`,
reads JSON commands on its fd 3 and writes replies and events on its fd 4, each message ended by a NUL byte.
One page, its network requests, console messages and exceptions recorded as they come.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# The flags this machine's notes name for a headless Chromium as root with no network, and no first-run noise.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
         "--disable-dev-shm-usage")  # a container's small /dev/shm would crash a large page's renderer


def find_chromium():
    """The Chromium to drive: $DEBATECV_CHROMIUM, else chromium on the PATH (Debian's), else None."""
    named = os.environ.get("DEBATECV_CHROMIUM")
    if named:
        return named
    return next((found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None)


class BrowserError(RuntimeError):
    pass


class Browser:
    """A headless Chromium with one page. `open(url)`, `evaluate(js)`, `screenshot()`; `events` holds every
    event of the page (requests, console, exceptions) since it was made."""

    def __init__(self, executable=None, width=1280, height=900, timeout=60):
        executable = executable or find_chromium()
        if not executable:
            raise BrowserError("no Chromium found (apt-get install chromium, or set DEBATECV_CHROMIUM)")
        self.timeout, self.events, self._buffer, self._next = timeout, [], b"", 0
        self._profile = tempfile.mkdtemp(prefix="debatecv-chromium-")
        self._log = open(Path(self._profile) / "stderr.log", "wb")  # noqa: SIM115 (closed by close())
        commands, replies = os.pipe(), os.pipe()  # (read, write) each: we write commands, read replies
        # The browser wants the commands on its fd 3 and its replies on fd 4. Bash puts them there (no
        # preexec_fn, which is unsafe beside threads); copies at 10 and up cannot collide with 3 and 4.
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands[0], replies[1])]
        self._process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{theirs[0]} 4>&{theirs[1]} {theirs[0]}<&- {theirs[1]}>&-',
             executable, *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-pipe",
             "about:blank"], pass_fds=theirs, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        for fd in (*theirs, commands[0], replies[1]):
            os.close(fd)
        self._out, self._in = commands[1], replies[0]
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
            self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                      session=None)["sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    # -------------------------------------------------------- the protocol

    def _read(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError(f"Chromium did not answer within {self.timeout} s{self._stderr()}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe{self._stderr()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _stderr(self):
        self._log.flush()
        text = (Path(self._profile) / "stderr.log").read_text(errors="replace").strip()
        return f"; its stderr ends: {text[-800:]}" if text else ""

    def call(self, method, params=None, session=True):
        """Send one command and wait for its reply (events meanwhile go to `events`); its result."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, since=0):
        """The first event `method` at or after position `since` of `events`, waiting for it if need be."""
        deadline = time.monotonic() + self.timeout
        while True:
            found = next((e for e in self.events[since:] if e.get("method") == method), None)
            if found:
                return found
            self.events.append(self._read(deadline))

    # -------------------------------------------------------- the page

    def open(self, url):
        """Load `url` and wait for its load event."""
        since = len(self.events)
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired", since)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]!r} threw: {result['exceptionDetails'].get('text')} "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def screenshot(self):
        """The page's viewport as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])

    def requests(self):
        """Every URL the page asked for, in order."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def errors(self):
        """Console errors and warnings, browser log errors and uncaught exceptions, as text."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('text')} {details.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                     for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return found

    def close(self):
        try:
            if self._process.poll() is None:
                try:
                    self.call("Browser.close", session=None)
                except (BrowserError, OSError):
                    pass
                try:
                    self._process.wait(10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def png_size(data):
    """(width, height) from a PNG's header."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
