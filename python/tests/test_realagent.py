"""The Python client against the real agent binary (tests/realagent.py):
where the fake could disagree with the agent, the agent decides."""

import io
import os
import subprocess
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import spotagent  # noqa: E402
from realagent import NodeAgent  # noqa: E402
from test_client import Base  # noqa: E402


class TestNodeRefusedHello(Base):
    """Issue 24 item 8: `spotagent node` refuses SPOTAGENT_RUN_ID=../x; the
    trainer must not train on unprotected without saying so."""

    def setUp(self):
        Base.setUp(self)
        self.node = NodeAgent(self.tmp)

    def tearDown(self):
        self.node.stop()
        Base.tearDown(self)

    def test_bad_run_id_raises_from_connect(self):
        with mock.patch.object(sys, "stderr", io.StringIO()):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect(path=self.node.socket, run_id="../x", welcome_timeout=10)
        self.assertIn("refused", cm.exception.error)
        self.assertIn("run id", cm.exception.error)

    def test_good_run_id_is_welcomed(self):
        a = self.connect(path=self.node.socket, run_id="exp-1", welcome_timeout=10)
        self.assertEqual(a.run_id, "exp-1")
        self.assertIsNone(a.poll(1))

    def test_trainer_exits_non_zero_unless_opted_out(self):
        code = "import spotagent, sys; a = spotagent.connect(welcome_timeout=10); a.poll(1); a.close()"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTAGENT_")}
        env.update(SPOTAGENT_SOCKET=self.node.socket, SPOTAGENT_RUN_ID="../x",
                   PYTHONPATH=os.path.join(HERE, ".."))
        r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"AgentRefused", r.stderr)
        env["SPOTAGENT_ALLOW_UNPROTECTED"] = "1"
        r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"running WITHOUT an agent", r.stderr)


if __name__ == "__main__":
    unittest.main()
