"""The examples resume exactly: interrupted + resumed == uninterrupted, bit for bit.

train.py runs under the interpreter running the tests; train_torch.py runs
under /usr/bin/python3 (Debian's python3-torch). If torch is not importable
there the torch test FAILS, unless SPOTAGENT_ALLOW_NO_TORCH=1.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fakeagent import DEADLINE, FakeAgent  # noqa: E402

EXAMPLES = os.path.join(HERE, "..", "examples")
TORCH_PYTHON = os.environ.get("SPOTAGENT_TORCH_PYTHON", "/usr/bin/python3")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTAGENT_") and k not in ("RANK", "WORLD_SIZE")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class ExampleCase(unittest.TestCase):
    python = sys.executable
    script = ""
    steps = 100

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spa-ex-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_example(self, out=None, **env):
        cmd = [self.python, os.path.join(EXAMPLES, self.script), "--steps", str(self.steps), "--step-time", "0"]
        if out:
            cmd += ["--out", out]
        p = subprocess.run(cmd, env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300, universal_newlines=True)
        self.assertEqual(p.returncode, 0, "%s failed:\n%s" % (" ".join(cmd), p.stdout))
        return p.stdout

    def read(self, path):
        with open(path) as f:
            return json.load(f)

    def check_resume_exact(self, ks):
        full = os.path.join(self.tmp, "full.json")
        log = self.run_example(out=full)
        self.assertIn("starting fresh", log)
        self.assertEqual(self.read(full)["step"], self.steps)
        ckdir = os.path.join(self.tmp, "ck")
        for k in ks:
            with self.subTest(stop_at=k):
                log = self.run_example(SPOTAGENT_CHECKPOINT_DIR=ckdir, SPOTAGENT_EXAMPLE_STOP_AT=k)
                saved = os.path.join(ckdir, "example-stop-%d" % k)
                self.assertTrue(os.path.isdir(saved), log)
                self.assertNotIn("finished", log)
                out = os.path.join(self.tmp, "resumed-%d.json" % k)
                log = self.run_example(out=out, SPOTAGENT_RESUME_DIR=saved, SPOTAGENT_RESUME_STEP=k)
                self.assertIn("resuming from step %d" % k, log)
                self.assertEqual(self.read(out), self.read(full), "resumed at step %d differs from uninterrupted" % k)
                with open(out, "rb") as a, open(full, "rb") as b:
                    self.assertEqual(a.read(), b.read())


class TestTrainStdlib(ExampleCase):
    script = "train.py"
    steps = 100  # 32 batches per epoch

    def test_resume_is_exact(self):
        self.check_resume_exact([7, 32, 40])

    def test_save_bytes_payload(self):
        ckdir = os.path.join(self.tmp, "ck")
        env = clean_env(SPOTAGENT_CHECKPOINT_DIR=ckdir, SPOTAGENT_EXAMPLE_STOP_AT=3)
        subprocess.run([self.python, os.path.join(EXAMPLES, self.script), "--steps", "10", "--step-time", "0",
                        "--save-bytes", "3000000"], env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
        self.assertEqual(os.path.getsize(os.path.join(ckdir, "example-stop-3", "payload.bin")), 3000000)

    def test_under_fake_agent(self):
        """The protocol path: checkpoint -> done -> committed -> stop; then resume via welcome."""
        sock = os.path.join(self.tmp, "a.sock")
        ckpt = os.path.join(self.tmp, "agent-ck", "000000000001-x")
        srv = FakeAgent(sock, welcome={"type": "welcome", "version": 1, "run_id": "r", "checkpoint_dir": self.tmp,
                                       "resume": None})
        try:
            cmd = [self.python, os.path.join(EXAMPLES, self.script), "--steps", "100000", "--step-time", "0.001"]
            p = subprocess.Popen(cmd, env=clean_env(SPOTAGENT_SOCKET=sock), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True)
            try:
                srv.wait_message("progress")
                srv.send({"type": "checkpoint", "id": "x", "reason": "interruption", "dir": ckpt,
                          "deadline": "2999-01-01T00:00:00Z"})
                done = srv.wait_message("done")[0]
                self.assertEqual(done["id"], "x")
                self.assertEqual(set(done["metadata"]), {"epoch", "batch", "loss"})
                srv.send({"type": "committed", "id": "x", "uri": "file:///store/x"})
                srv.send({"type": "stop", "reason": "interruption"})
                out, _ = p.communicate(timeout=DEADLINE)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            self.assertEqual(p.returncode, 75, out)  # EXIT_INTERRUPTED: run me again
            self.assertIn("stopping at step", out)
        finally:
            srv.stop()
        step = done["step"]
        with open(os.path.join(ckpt, "state.json")) as f:
            self.assertEqual(json.load(f)["step"], step)

        # Uninterrupted reference vs. a resume announced through the welcome.
        self.steps = step + 50
        full = os.path.join(self.tmp, "full.json")
        self.run_example(out=full)
        srv = FakeAgent(sock, welcome={"type": "welcome", "version": 1, "run_id": "r", "checkpoint_dir": self.tmp,
                                       "resume": {"dir": ckpt, "step": step, "id": "x", "manifest": "m",
                                                  "metadata": done["metadata"]}})
        try:
            out = os.path.join(self.tmp, "resumed.json")
            log = self.run_example(out=out, SPOTAGENT_SOCKET=sock)
        finally:
            srv.stop()
        self.assertIn("resuming from step %d" % step, log)
        self.assertEqual(self.read(out), self.read(full))


class TestTrainTorch(ExampleCase):
    python = TORCH_PYTHON
    script = "train_torch.py"
    steps = 80  # 32 batches per epoch: the stops cover mid-epoch, end of epoch, a later epoch

    def setUp(self):
        super().setUp()
        try:
            probe = subprocess.run([self.python, "-c", "import torch, numpy"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, universal_newlines=True)
            rc, output = probe.returncode, probe.stdout
        except OSError as e:
            rc, output = -1, str(e)
        if rc != 0:
            msg = "torch is not importable under %s:\n%s" % (self.python, output)
            if os.environ.get("SPOTAGENT_ALLOW_NO_TORCH") == "1":
                self.skipTest(msg)
            self.fail(msg + "\n(install Debian's python3-torch, or set SPOTAGENT_ALLOW_NO_TORCH=1 to skip)")

    def test_resume_is_exact(self):
        self.check_resume_exact([13, 32, 40])
        doc = self.read(os.path.join(self.tmp, "full.json"))
        self.assertEqual(len(doc["sha256"]), 64)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "full.json.pt")))


if __name__ == "__main__":
    unittest.main()
