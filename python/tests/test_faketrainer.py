"""faketrainer.py, the end-to-end tests' fake trainer, against the fake
agent: its default answer, its trace of what the agent says, and a
per-request plan (answer the first, crash half-way through the second)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fakeagent import DEADLINE, FakeAgent  # noqa: E402

FAKE_TRAINER = os.path.join(HERE, "faketrainer.py")


class TestFakeTrainer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spa-ft-")
        self.sock = os.path.join(self.tmp, "a.sock")
        self.srv = FakeAgent(self.sock, welcome={"type": "welcome", "version": 2, "run_id": "r",
                                                 "checkpoint_dir": self.tmp, "resume": None})
        self.addCleanup(self.srv.stop)
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def start(self, *flags):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTAGENT_")}
        env["SPOTAGENT_SOCKET"] = self.sock
        p = subprocess.Popen([sys.executable, FAKE_TRAINER] + list(flags), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True)

        def reap():
            if p.poll() is None:
                p.kill()
            p.communicate()

        self.addCleanup(reap)
        self.srv.wait_message("progress")
        return p

    def request(self, cid):
        d = os.path.join(self.tmp, cid)
        self.srv.send({"type": "checkpoint", "id": cid, "reason": "periodic", "dir": d,
                       "deadline": "2999-01-01T00:00:00Z"})
        return d

    def test_answers_and_stops(self):
        p = self.start("--file", "model.bin:3000:A")
        d = self.request("c1")
        done = self.srv.wait_message("done")[0]
        self.assertEqual(done["id"], "c1")
        with open(os.path.join(d, "model.bin"), "rb") as f:
            self.assertEqual(f.read(), b"A" * 3000)
        self.srv.send({"type": "stop", "reason": "interruption"})
        out, _ = p.communicate(timeout=DEADLINE)
        self.assertEqual(p.returncode, 75, out)  # EXIT_INTERRUPTED
        self.assertIn("trainer: got checkpoint id=c1 reason=periodic", out)
        self.assertIn("trainer: saved checkpoint c1 (periodic) at step %d" % done["step"], out)
        self.assertIn("trainer: stopping at step", out)

    def test_plan_by_request(self):
        p = self.start("--on", "1=write,done", "--on", "write:state.bin:512:x,crash:3")
        self.request("c1")
        self.srv.wait_message("done")
        d = self.request("c2")
        out, _ = p.communicate(timeout=DEADLINE)
        self.assertEqual(p.returncode, 3, out)
        self.assertIn("trainer: crashing mid-save c2", out)
        self.assertEqual(os.path.getsize(os.path.join(d, "state.bin")), 512)
        self.assertEqual([m["id"] for m in self.srv.of_type("done")], ["c1"])


if __name__ == "__main__":
    unittest.main()
