"""The restore that runs while the trainer starts (protocol 2): the client
blocks only where the trainer first needs the files, and never hands out a
fresh start while the restore runs or after it failed. Against fakeagent.py,
whose answers test_golden.py holds to the real agent's."""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import spotagent  # noqa: E402
from fakeagent import DEADLINE  # noqa: E402
from test_client import Base  # noqa: E402

WELCOME = {"type": "welcome", "version": 2, "run_id": "run-42", "checkpoint_dir": "/ckpt"}
RESUME = {"dir": "/restore/000000000120-abc", "step": 120, "id": "abc", "manifest": "/restore/m.json",
          "metadata": {"epoch": 3}}


class TestRestorePending(Base):
    def setUp(self):
        Base.setUp(self)
        os.environ.pop("SPOTAGENT_RESUME", None)

    def test_hello_says_version_2(self):
        srv = self.server(welcome=WELCOME)
        self.connect()
        self.assertEqual(srv.wait_message("hello")[0]["version"], 2)

    def test_resume_blocks_until_restored(self):
        srv = self.server(welcome=WELCOME, restore="pending")
        a = self.connect()
        self.assertTrue(a.restore_pending)
        self.assertFalse(a.wait_restored(timeout=0.05))
        got = []
        t = threading.Thread(target=lambda: got.append((a.resume_step, a.resume_dir, a.resume_metadata)))
        t.start()
        self.assertTrue(srv.wait_for(lambda: len(srv.waiting) == 1))
        self.assertEqual(got, [], "resume_step answered while the restore was pending")
        srv.restore_done(resume=RESUME)
        t.join(DEADLINE)
        self.assertEqual(got, [(120, "/restore/000000000120-abc", {"epoch": 3})])
        self.assertFalse(a.restore_pending)
        self.assertTrue(a.wait_restored(timeout=0))

    def test_restored_without_resume_is_a_definite_fresh_start(self):
        srv = self.server(welcome=WELCOME, restore="pending")
        os.environ["SPOTAGENT_RESUME_DIR"] = "/stale"  # never used once the agent said pending
        a = self.connect()
        srv.restore_done(resume=None)
        self.assertTrue(a.wait_restored(timeout=DEADLINE))
        self.assertIsNone(a.resume_dir)
        self.assertIsNone(a.resume_step)

    def test_failed_restore_raises_never_fresh(self):
        srv = self.server(welcome=WELCOME, restore="pending")
        a = self.connect()
        errs = []

        def read():
            try:
                a.resume_step
            except spotagent.RestoreFailed as e:
                errs.append(e.error)

        t = threading.Thread(target=read)
        t.start()
        self.assertTrue(srv.wait_for(lambda: len(srv.waiting) == 1))
        srv.restore_done(error="restore: connection reset by peer")
        t.join(DEADLINE)
        self.assertEqual(errs, ["restore: connection reset by peer"])
        with self.assertRaises(spotagent.RestoreFailed):
            a.resume_dir
        with self.assertRaises(spotagent.RestoreFailed):
            a.poll(1)

    def test_welcome_after_failure_says_failed(self):
        srv = self.server(welcome=WELCOME)
        srv.restore_error = "restore: no space left on device"
        a = self.connect()
        with self.assertRaises(spotagent.RestoreFailed) as cm:
            a.wait_restored(timeout=DEADLINE)
        self.assertIn("no space left", cm.exception.error)

    def test_env_pending_blocks_before_any_welcome(self):
        # The agent said SPOTAGENT_RESUME=pending: no welcome yet is no
        # fresh start, and the resume variables are not to be trusted.
        srv = self.server(welcome=None)
        os.environ["SPOTAGENT_RESUME"] = "pending"
        a = self.connect(welcome_timeout=0.05)
        srv.wait_message("hello")
        self.assertTrue(a.restore_pending)
        self.assertFalse(a.wait_restored(timeout=0.05))
        srv.send(dict(WELCOME, resume=RESUME))
        self.assertTrue(a.wait_restored(timeout=DEADLINE))
        self.assertEqual(a.resume_step, 120)

    def test_agent_gone_while_pending_raises(self):
        srv = self.server(welcome=WELCOME, restore="pending")
        a = self.connect()
        self.assertTrue(a.restore_pending)
        a.close(timeout=0.5)
        with self.assertRaises(spotagent.RestoreFailed):
            a.resume_step

    def test_older_agent_resume_is_final_at_welcome(self):
        # An agent of protocol 1 ignores hello's version and restores first.
        self.server(welcome=dict(WELCOME, version=1, resume=RESUME))
        a = self.connect()
        self.assertFalse(a.restore_pending)
        start = time.monotonic()
        self.assertEqual(a.resume_step, 120)
        self.assertLess(time.monotonic() - start, DEADLINE)

    def test_no_agent_never_blocks(self):
        os.environ["SPOTAGENT_RESUME"] = "pending"
        a = spotagent.connect(path=None)
        self.assertTrue(a.wait_restored(timeout=0))
        self.assertIsNone(a.resume_step)


if __name__ == "__main__":
    unittest.main()
