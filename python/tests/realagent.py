"""The real spotagent binary for the Python tests: built once per test
process from this checkout (or $SPOTAGENT_BIN), run on loopback only with
``--cloud none`` and a file:// store.

A test that needs it and cannot build it fails, unless
SPOTAGENT_ALLOW_NO_GO=1 (then it is skipped, saying why).
"""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEADLINE = 20.0

_lock = threading.Lock()
_built = None  # type: Optional[str]


def binary() -> str:
    """Path of a spotagent binary: $SPOTAGENT_BIN, else built from REPO."""
    global _built
    env = os.environ.get("SPOTAGENT_BIN")
    if env:
        return env
    with _lock:
        if _built is not None:
            return _built
        go = shutil.which("go")
        if go is None:
            msg = "go not found on PATH: cannot build the real agent (set SPOTAGENT_BIN)"
            if os.environ.get("SPOTAGENT_ALLOW_NO_GO") == "1":
                raise unittest.SkipTest(msg)
            raise AssertionError(msg + " (SPOTAGENT_ALLOW_NO_GO=1 skips)")
        out = os.path.join(tempfile.mkdtemp(prefix="spa-bin-"), "spotagent")
        env2 = dict(os.environ, CGO_ENABLED="0")
        r = subprocess.run([go, "build", "-tags", "disable_grpc_modules", "-o", out, "./cmd/spotagent"],
                           cwd=REPO, env=env2, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise AssertionError("go build ./cmd/spotagent failed:\n" + r.stdout.decode()[-3000:])
        _built = out
        return out


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class NodeAgent(object):
    """``spotagent node`` on a socket in tmp, its runs' stores under tmp."""

    def __init__(self, tmp: str, extra: Optional[List[str]] = None) -> None:
        self.socket = os.path.join(tmp, "node.sock")
        self.log_path = os.path.join(tmp, "node.log")
        args = [binary(), "node", "--cloud", "none", "--socket", self.socket,
                "--store-prefix", "file://" + os.path.join(tmp, "store"),
                "--checkpoint-root", os.path.join(tmp, "ckpt"), "--interval", "1h",
                "--log-format", "json"] + list(extra or [])
        env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true")
        env.pop("SPOTAGENT_SOCKET", None)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        end = time.monotonic() + DEADLINE
        # Listening, not only bound: the socket file exists a moment before
        # the agent listens, and a client whose first connect fails does not
        # wait in connect() (it retries in the background).
        while not _accepts(self.socket):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise AssertionError("spotagent node did not listen on %s:\n%s" % (self.socket, self.log()))
            time.sleep(0.02)  # polling for the agent to listen, with a deadline

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
