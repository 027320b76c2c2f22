"""Fixtures of the server suite: the `specinfer` command, the models, a running server.

The models come from $SPECINFER_MODELS (default ~/.cache/specinfer/models), as for the C tests
(tests/support/models.h): a test whose model is absent is skipped, saying which.
"""
import os
import re
import signal
import struct
import subprocess
import threading
import time

import pytest

CLI = os.environ.get("SPECINFER_CLI", "")
# Seconds: every request, every wait. Sanitizer builds run several times slower: a request that
# fills the context takes over a minute there.
SANITIZED = bool(os.environ.get("SPECINFER_SANITIZED"))
TIMEOUT = 240 if SANITIZED else 60


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "release_only(why): the test's subject is not memory or threads (a rendering, "
        "a resident-memory figure); the sanitizer builds skip it, the release build runs it")


def pytest_collection_modifyitems(config, items):
    if not SANITIZED:
        return
    for item in items:
        mark = item.get_closest_marker("release_only")
        if mark:
            item.add_marker(pytest.mark.skip(reason="release build only: " + mark.args[0]))


def models_dir():
    d = os.environ.get("SPECINFER_MODELS", "")
    return d if d else os.path.join(os.environ.get("HOME", "."), ".cache/specinfer/models")


def model_path(name):
    """The path of model file `name`, or skips the test when it is absent."""
    path = os.path.join(models_dir(), name)
    if not os.path.isfile(path):
        pytest.skip(f"model {path} is absent (scripts/fetch-models all fetches it)")
    return path


def gguf_metadata(path, key):
    """The string value of metadata `key` in the GGUF file at `path`, or None."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))

        def string():
            (n,) = read("Q")
            return f.read(n).decode("utf-8")

        def value(t):
            if t == 8:
                return string()
            if t == 9:
                (at,) = read("I")
                (n,) = read("Q")
                return [value(at) for _ in range(n)]
            return read(scalar[t])[0]

        assert f.read(4) == b"GGUF"
        read("I")
        _, n_kv = read("QQ")
        for _ in range(n_kv):
            k = string()
            (t,) = read("I")
            v = value(t)
            if k == key:
                return v
    return None


class Server:
    """`specinfer serve` on 127.0.0.1, a free port chosen by the server (--port 0)."""

    def __init__(self, args):
        if not CLI:
            pytest.fail("SPECINFER_CLI is not set (ctest sets it)")
        self.clients = []  # objects with close(): closed before the server stops
        self.proc = subprocess.Popen(
            [CLI, "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + TIMEOUT
        self.log = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
                # Keep reading stderr, so that the server never blocks on a full pipe.
                threading.Thread(target=self._drain, daemon=True).start()
                return
        self.stop()
        pytest.fail("the server did not start:\n" + "".join(self.log))

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self):
        # An idle keep-alive connection holds one of the server's threads until its client closes
        # it or the keep-alive timeout (5 s) ends, and the server waits for its threads to stop.
        for c in self.clients:
            c.close()
        self.clients.clear()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def generate(target, drafter, prompt, n, *options):
    """What `specinfer generate` prints (the text, a newline added if missing): a greedy run, or
    one with `options` (as "--temp", "0.9")."""
    out = subprocess.run(
        [CLI, "generate", "--target", target, "--drafter", drafter, "--threads", "2",
         "--prompt", prompt, "-n", str(n), *options],
        capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return out.stdout
