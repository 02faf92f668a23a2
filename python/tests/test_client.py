import datetime
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import spotagent  # noqa: E402
from spotagent.client import parse_time  # noqa: E402
from fakeagent import DEADLINE, FakeAgent  # noqa: E402

ENV_KEYS = [
    "SPOTAGENT_SOCKET",
    "SPOTAGENT_RUN_ID",
    "SPOTAGENT_CHECKPOINT_DIR",
    "SPOTAGENT_RESUME_DIR",
    "SPOTAGENT_RESUME_STEP",
    "SPOTAGENT_RESUME_MANIFEST",
    "SPOTAGENT_RESUME",
    "SPOTAGENT_WELCOME_TIMEOUT",
    "RANK",
    "WORLD_SIZE",
    "SPOTAGENT_AGENT_UID",
    "SPOTAGENT_HANDLE_SIGTERM",
    "SPOTAGENT_SIGTERM_WAIT",
    "SPOTAGENT_EXIT_FILE",
    "SPOTAGENT_ALLOW_UNPROTECTED",
    "SPOTAGENT_REFUSED_TIMEOUT",
]

WELCOME = {
    "type": "welcome",
    "version": 1,
    "run_id": "run-42",
    "checkpoint_dir": "/ckpt",
    "resume": {
        "dir": "/restore/000000000120-abc",
        "step": 120,
        "id": "abc",
        "manifest": "checkpoints/000000000120-abc/manifest.json",
        "metadata": {"epoch": 3},
    },
}


def wait_agent(agent, pred, timeout=DEADLINE):
    """Wait on the client's own condition variable (notified on every state change)."""
    with agent._cond:
        return agent._cond.wait_for(pred, timeout)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spa-")
        self.sock = os.path.join(self.tmp, "agent.sock")
        self.env = mock.patch.dict(os.environ, {})
        self.env.start()
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        self.servers = []
        self.agents = []
        logging.getLogger("spotagent").setLevel(logging.ERROR)  # keep test output readable

    def tearDown(self):
        for a in self.agents:
            a.close(timeout=1.0)
        for s in self.servers:
            s.stop()
        self.env.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def server(self, **kw):
        kw.setdefault("welcome", WELCOME)
        s = FakeAgent(self.sock, **kw)
        self.servers.append(s)
        return s

    def connect(self, **kw):
        kw.setdefault("path", self.sock)
        a = spotagent.connect(**kw)
        self.agents.append(a)
        return a

    def pending(self, agent, n=1):
        self.assertTrue(wait_agent(agent, lambda: len(agent._requests) >= n), "request never arrived")


class TestHandshake(Base):
    def test_hello_and_welcome_with_resume(self):
        srv = self.server()
        a = self.connect(rank=1, world_size=4)
        # connect() waited for the welcome: resume info is ready at once.
        self.assertEqual(a.resume_dir, "/restore/000000000120-abc")
        self.assertEqual(a.resume_step, 120)
        self.assertEqual(a.resume_metadata, {"epoch": 3})
        self.assertEqual(a.run_id, "run-42")
        self.assertEqual(a.checkpoint_dir, "/ckpt")
        self.assertTrue(a.enabled)
        hello = srv.wait_message("hello")[0]
        self.assertEqual(hello["pid"], os.getpid())
        self.assertEqual(hello["rank"], 1)
        self.assertEqual(hello["world_size"], 4)

    def test_socket_from_env_and_rank_from_torchrun_env(self):
        srv = self.server()
        os.environ["SPOTAGENT_SOCKET"] = self.sock
        os.environ["RANK"] = "2"
        os.environ["WORLD_SIZE"] = "8"
        a = spotagent.connect()
        self.agents.append(a)
        hello = srv.wait_message("hello")[0]
        self.assertEqual((hello["rank"], hello["world_size"]), (2, 8))
        self.assertNotIn("run_id", hello)
        self.assertEqual(a.run_id, "run-42")

    def test_welcome_without_resume(self):
        self.server(welcome={"type": "welcome", "version": 1, "run_id": "r", "checkpoint_dir": "/c", "resume": None})
        os.environ["SPOTAGENT_RESUME_DIR"] = "/stale"  # the welcome is authoritative
        a = self.connect()
        self.assertIsNone(a.resume_dir)
        self.assertIsNone(a.resume_step)
        self.assertIsNone(a.resume_metadata)

    def test_env_fallback_until_welcome(self):
        srv = self.server(welcome=None)  # agent answers nothing
        os.environ.update(
            {
                "SPOTAGENT_RUN_ID": "env-run",
                "SPOTAGENT_CHECKPOINT_DIR": "/env-ckpt",
                "SPOTAGENT_RESUME_DIR": "/env-restore",
                "SPOTAGENT_RESUME_STEP": "77",
            }
        )
        t0 = time.monotonic()
        a = self.connect(welcome_timeout=0.3)
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual((a.run_id, a.checkpoint_dir, a.resume_dir, a.resume_step), ("env-run", "/env-ckpt", "/env-restore", 77))
        srv.wait_message("hello")
        srv.send(WELCOME)
        self.assertTrue(wait_agent(a, lambda: a._welcome is not None))
        self.assertEqual((a.run_id, a.resume_step), ("run-42", 120))

    def test_unreachable_agent_then_appears(self):
        t0 = time.monotonic()
        a = self.connect()  # nothing listening yet
        self.assertLess(time.monotonic() - t0, 1.5, "connect() must not wait for an absent agent")
        self.assertIsNone(a.poll(1))
        self.assertFalse(a.connected)
        srv = self.server()
        srv.wait_message("hello")
        self.assertTrue(wait_agent(a, lambda: a.resume_step == 120))
        srv.send({"type": "checkpoint", "id": "c1", "reason": "manual", "dir": self.tmp})
        self.pending(a)
        self.assertEqual(a.poll(2).id, "c1")


class TestNoop(Base):
    def test_noop_without_socket(self):
        t0 = time.monotonic()
        a = spotagent.connect()
        self.assertLess(time.monotonic() - t0, 0.5)
        self.assertFalse(a.enabled)
        self.assertIsNone(a.poll(0))
        self.assertFalse(a.should_stop)
        self.assertIsNone(a.resume_dir)
        self.assertIsNone(a.resume_step)
        self.assertIsNone(a.checkpoint_dir)
        self.assertIsNone(a.last_committed)
        self.assertIsNone(a.wait_committed("x", timeout=0))
        a.checkpoint_done(5, "/somewhere", {"a": 1})  # accepted and ignored
        with a:
            pass
        a.close()

    def test_noop_warns_when_configured_for_an_agent(self):
        # The agent's environment without its socket (env -u, a container
        # missing SPOTAGENT_SOCKET): training runs unprotected, said on stderr.
        import io

        for env in ({"SPOTAGENT_RUN_ID": "r1"}, {"SPOTAGENT_CHECKPOINT_DIR": "/c"}):
            for k in ENV_KEYS:
                os.environ.pop(k, None)
            os.environ.update(env)
            err = io.StringIO()
            with mock.patch.object(sys, "stderr", err):
                a = spotagent.connect()
            self.assertFalse(a.enabled)
            self.assertIn("SPOTAGENT_SOCKET is not", err.getvalue())
            self.assertIn("nothing will be checkpointed", err.getvalue())
            self.assertIn(list(env)[0], err.getvalue())

    def test_noop_bare_is_quiet(self):
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            spotagent.connect()
        self.assertEqual(err.getvalue(), "")

    def test_noop_resume_from_env_and_manifest(self):
        manifest = os.path.join(self.tmp, "manifest.json")
        with open(manifest, "w") as f:
            json.dump({"format": "spotagent.checkpoint/v1", "step": 40, "metadata": {"epoch": 2}}, f)
        os.environ.update(
            {
                "SPOTAGENT_CHECKPOINT_DIR": "/c",
                "SPOTAGENT_RUN_ID": "r9",
                "SPOTAGENT_RESUME_DIR": "/r",
                "SPOTAGENT_RESUME_STEP": "40",
                "SPOTAGENT_RESUME_MANIFEST": manifest,
            }
        )
        a = spotagent.connect()
        self.assertFalse(a.enabled)
        self.assertEqual((a.checkpoint_dir, a.run_id, a.resume_dir, a.resume_step), ("/c", "r9", "/r", 40))
        self.assertEqual(a.resume_metadata, {"epoch": 2})

    def test_bad_resume_step_env_is_ignored(self):
        os.environ.update({"SPOTAGENT_RESUME_DIR": "/r", "SPOTAGENT_RESUME_STEP": "soon"})
        a = spotagent.connect()
        self.assertEqual((a.resume_dir, a.resume_step), ("/r", None))


class TestCheckpoint(Base):
    def test_checkpoint_done_roundtrip(self):
        srv = self.server()
        a = self.connect()
        d = os.path.join(self.tmp, "ck1")
        srv.send({"type": "checkpoint", "id": "000000000007-k1", "reason": "interruption", "dir": d,
                  "deadline": "2030-01-02T03:04:05.123456789Z", "unknown_field": True})
        self.pending(a)
        req = a.poll(7)
        self.assertIsInstance(req, spotagent.CheckpointRequest)
        self.assertEqual((req.id, req.reason, req.dir), ("000000000007-k1", "interruption", d))
        self.assertTrue(os.path.isdir(d))
        self.assertEqual(req.deadline, datetime.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.timezone.utc))
        self.assertGreater(req.time_left(), 0)
        self.assertIsNone(a.poll(7))  # handed out once
        req.done(7, metadata={"epoch": 1, "loss": 0.5})
        done = srv.wait_message("done")[0]
        self.assertEqual(done, {"type": "done", "id": "000000000007-k1", "step": 7, "metadata": {"epoch": 1, "loss": 0.5}})
        req.done(8)  # a second answer is ignored (logged)
        srv.send({"type": "committed", "id": "000000000007-k1", "uri": "file:///s/checkpoints/000000000007-k1"})
        c = a.wait_committed("000000000007-k1", timeout=DEADLINE)
        srv.send({"type": "committed", "id": "other", "uri": "u", "step": 99})  # "It may carry step"
        self.assertTrue(wait_agent(a, lambda: a.last_committed.id == "other"))
        self.assertEqual(a.last_committed.step, 99)
        self.assertEqual(c, spotagent.Committed("000000000007-k1", "file:///s/checkpoints/000000000007-k1", 7))
        self.assertEqual(a.wait_committed("000000000007-k1", timeout=0), c)
        self.assertEqual(len(srv.of_type("done")), 1)

    def test_checkpoint_without_deadline_and_fail(self):
        srv = self.server()
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "p1", "reason": "periodic", "dir": os.path.join(self.tmp, "p1")})
        self.pending(a)
        req = a.poll(3)
        self.assertIsNone(req.deadline)
        self.assertIsNone(req.time_left())
        req.fail("disk full")
        self.assertEqual(srv.wait_message("failed")[0], {"type": "failed", "id": "p1", "error": "disk full"})

    def test_fail_names_an_oserrors_errno(self):
        # A real ENOSPC from the kernel (/dev/full): the errno goes first by
        # name, so that the agent names the cause.
        srv = self.server()
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "p2", "reason": "periodic", "dir": os.path.join(self.tmp, "p2")})
        self.pending(a)
        req = a.poll(3)
        try:
            with open("/dev/full", "wb", buffering=0) as f:
                f.write(b"x")
        except OSError as e:
            req.fail(e)
        msg = srv.wait_message("failed")[0]
        self.assertTrue(msg["error"].startswith("ENOSPC: [Errno 28]"), msg)

    def test_requests_fifo(self):
        srv = self.server()
        a = self.connect()
        for i in range(3):
            srv.send({"type": "checkpoint", "id": "c%d" % i, "reason": "periodic", "dir": self.tmp})
        self.pending(a, 3)
        self.assertEqual([a.poll(1).id for _ in range(3)], ["c0", "c1", "c2"])
        self.assertIsNone(a.poll(1))

    def test_unsolicited_done(self):
        srv = self.server()
        a = self.connect()
        a.checkpoint_done(50, "/ckpt/mine-50", metadata={"epoch": 4})
        self.assertEqual(srv.wait_message("done")[0],
                         {"type": "done", "id": "", "step": 50, "dir": "/ckpt/mine-50", "metadata": {"epoch": 4}})

    def test_unsolicited_done_queued_until_connected(self):
        a = self.connect()  # no agent yet
        a.checkpoint_done(9, "/ckpt/x")
        srv = self.server()
        msgs = srv.wait_message("done")
        self.assertEqual(msgs[0]["step"], 9)
        with srv.cond:
            self.assertEqual([m["type"] for m in srv.received[:2]], ["hello", "done"])

    def test_bad_metadata_raises_in_caller(self):
        srv = self.server()
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "m", "reason": "manual", "dir": self.tmp})
        self.pending(a)
        req = a.poll(1)
        with self.assertRaises(TypeError):
            req.done(1, metadata={"x": object()})
        with self.assertRaises(TypeError):
            a.checkpoint_done(1, "/d", metadata=[1, 2])  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            a.checkpoint_done(1, "/d", metadata={"x": float("nan")})
        with self.assertRaises(ValueError):
            a.checkpoint_done(1, "/d", metadata={"x": "y" * (64 << 10)})  # the agent's 64 KiB limit
        req2 = spotagent.CheckpointRequest(a, a._conn, "n", "", "manual", None)
        req2.done(1, metadata={"x": "y" * 60000})  # under the limit: fine
        self.assertEqual(srv.wait_message("done")[0]["id"], "n")

    def test_upload_failed(self):
        srv = self.server()
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "u1", "reason": "periodic", "dir": self.tmp})
        self.pending(a)
        a.poll(1).done(1)
        srv.wait_message("done")
        srv.send({"type": "upload_failed", "id": "u1", "error": "bucket gone"})
        with self.assertRaises(spotagent.UploadFailed) as cm:
            a.wait_committed("u1", timeout=DEADLINE)
        self.assertEqual(cm.exception.error, "bucket gone")
        self.assertIsNone(a.wait_committed("never", timeout=0.05))


class TestStop(Base):
    def test_stop(self):
        srv = self.server()
        a = self.connect()
        self.assertFalse(a.should_stop)
        srv.send({"type": "stop", "reason": "interruption", "deadline": "2030-01-01T00:00:00+02:00"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        self.assertEqual(a.stop_reason, "interruption")
        self.assertEqual(a.stop_deadline, datetime.datetime(2029, 12, 31, 22, 0, tzinfo=datetime.timezone.utc))

    def test_exit_code(self):
        srv = self.server()
        a = self.connect()
        self.assertEqual(spotagent.EXIT_INTERRUPTED, 75)
        self.assertEqual(a.exit_code, 0)  # running, or finished on its own
        srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        self.assertEqual(a.exit_code, spotagent.EXIT_INTERRUPTED)

    def test_exit_file(self):
        # SPOTAGENT_EXIT_FILE gets 75 at close after an interruption stop
        # (a launcher that hides it, torchrun, is wrapped by a shell), and
        # nothing when the trainer was not stopped.
        path = os.path.join(self.tmp, "exit")
        os.environ["SPOTAGENT_EXIT_FILE"] = path  # ENV_KEYS: restored by tearDown
        srv = self.server()
        a = self.connect()
        a.close()
        self.assertFalse(os.path.exists(path))
        srv.stop()
        srv = self.server()
        a = self.connect()
        srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        a.close()
        with open(path) as f:
            self.assertEqual(f.read(), "75\n")

    def test_exit_code_of_every_stop_reason(self):
        # The table of docs/protocol.md "Exit codes" and python/README.md:
        # 75 run me again, 76 fenced, never 0 for a stop (#36 item 1: a
        # fenced trainer under a sidecar exited 0, and its Job Succeeded).
        self.assertEqual(spotagent.EXIT_FENCED, 76)
        for reason, want in (("interruption", 75), ("shutdown", 75), ("fenced", 76), ("", 75), ("new-reason", 75)):
            srv = self.server()
            a = self.connect()
            srv.send({"type": "stop", "reason": reason})
            self.assertTrue(wait_agent(a, lambda: a.should_stop))
            self.assertEqual(a.exit_code, want, reason)
            a.close()
            srv.stop()

    def test_exit_file_when_fenced(self):
        # A shell around torchrun (which reports its workers' 76 as 1)
        # passes on what the exit file says.
        path = os.path.join(self.tmp, "exit")
        os.environ["SPOTAGENT_EXIT_FILE"] = path  # ENV_KEYS: restored by tearDown
        srv = self.server()
        a = self.connect()
        srv.send({"type": "stop", "reason": "fenced"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        a.close()
        with open(path) as f:
            self.assertEqual(f.read(), "76\n")

    def test_exit_file_first_answer_stands_whole(self):
        # The first rank's answer stands (a later 75 does not replace a
        # crash's 1), the file appears whole (linked into place, never
        # empty for a reader), and nothing is left beside it.
        path = os.path.join(self.tmp, "exit")
        os.environ["SPOTAGENT_EXIT_FILE"] = path  # ENV_KEYS: restored by tearDown
        a = spotagent.connect(path="")
        a._write_exit_file(1)
        a._write_exit_file(75)
        with open(path) as f:
            self.assertEqual(f.read(), "1\n")
        self.assertEqual(sorted(os.listdir(self.tmp)), ["exit"])

    def test_noop_exit_code(self):
        self.assertEqual(spotagent.connect(path="").exit_code, 0)

    def test_checkpoint_then_stop_both_seen(self):
        srv = self.server()
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "s1", "reason": "shutdown", "dir": self.tmp})
        srv.send({"type": "stop", "reason": "shutdown"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        req = a.poll(10)  # the request is still handed out after stop
        self.assertEqual(req.id, "s1")
        req.done(10)
        self.assertEqual(srv.wait_message("done")[0]["id"], "s1")


class TestProgress(Base):
    def test_progress_rate_limited(self):
        srv = self.server()
        a = self.connect(progress_interval=3600)
        for step in range(1, 200):
            a.poll(step)
        a.checkpoint_done(999, "/marker")  # FIFO marker: everything before it was sent
        srv.wait_message("done")
        self.assertEqual([m["step"] for m in srv.of_type("progress")], [1])

    def test_progress_every_poll_when_interval_zero(self):
        srv = self.server()
        a = self.connect(progress_interval=0)
        a.poll(5)
        srv.wait_message("progress")
        a.poll(6)
        self.assertTrue(srv.wait_for(lambda: any(m.get("step") == 6 for m in srv.of_type("progress"))))


class TestRobustness(Base):
    def test_poll_never_blocks_when_agent_stops_reading(self):
        srv = self.server(read=False)  # sends welcome, never reads
        a = self.connect(progress_interval=0)
        self.assertEqual(a.resume_step, 120)
        pad = "x" * 60000  # under the 64 KiB metadata limit
        worst = 0.0
        for step in range(500):  # ~30 MB, far beyond any socket buffer
            t0 = time.monotonic()
            a.poll(step)
            a.checkpoint_done(step, "/d", metadata={"pad": pad})
            worst = max(worst, time.monotonic() - t0)
        self.assertLess(worst, 0.5, "poll/checkpoint_done blocked for %.3fs" % worst)
        # The writer really is stuck: messages are still queued.
        with a._cond:
            self.assertTrue(a._transport.outbound and a._transport.in_flight)
        t0 = time.monotonic()
        a.close(timeout=0.5)
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertIsNone(a.poll(1))

    def test_garbage_lines_ignored(self):
        srv = self.server()
        a = self.connect()
        srv.wait_message("hello")
        srv.send(b"this is not json\n")
        srv.send(b"[1, 2, 3]\n")
        srv.send(b'{"no": "type"}\n')
        srv.send(b'{"type": 7}\n')
        srv.send(b"\xff\xfe\n")
        srv.send(b"\n")
        srv.send(b'{"type": "status", "status": {"x": 1}}\n')
        srv.send(b'{"type": "what_is_this"}\n')
        srv.send(b'{"type": "error", "error": "unknown type \\"foo\\""}\n')
        srv.send(b'{"type": "welcome", "resume": {"dir": "/x", "step": "nope"}}\n')
        srv.send(b'{"type": "checkpoint", "id": "g1", "dir": "", "deadline": "tomorrow"}\n')
        srv.send(b"y" * (spotagent.MAX_LINE + 10) + b'{"type": "stop"}\n')  # over-long line: dropped whole
        srv.send(b'{"type": "committed", "id": "z", "uri": "u"}\n')
        self.assertTrue(wait_agent(a, lambda: a.last_committed is not None))
        self.assertFalse(a.should_stop)  # the stop inside the over-long line was not obeyed
        req = a.poll(1)
        self.assertEqual(req.id, "g1")
        self.assertIsNone(req.deadline)
        self.assertEqual(a.resume_step, 120)  # the bad second welcome changed nothing
        srv.send(b'{"type": "stop", "reason": "manual"}\n')
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        self.assertTrue(a.connected)
        self.assertEqual(srv.accepted, 1)

    def test_reconnect_after_agent_restart(self):
        srv = self.server()
        a = self.connect(progress_interval=0)
        srv.wait_message("hello")
        a.poll(11)
        srv.wait_message("progress")
        # A request that arrives and is handed out, then the connection dies.
        srv.send({"type": "checkpoint", "id": "old-handed", "reason": "periodic", "dir": self.tmp})
        self.pending(a)
        handed = a.poll(12)
        # A request that arrives but is never handed out before the connection dies.
        srv.send({"type": "checkpoint", "id": "old-queued", "reason": "periodic", "dir": self.tmp})
        self.pending(a)
        srv.restart()
        hellos = srv.wait_message("hello", count=2)
        self.assertEqual(len(hellos), 2)
        self.assertTrue(wait_agent(a, lambda: a.connected))
        self.assertIsNone(a.poll(13), "a request from a dead connection must be dropped")
        handed.done(12)  # dropped: its connection is gone
        a.checkpoint_done(13, "/marker")
        srv.wait_message("done")
        self.assertEqual([m["id"] for m in srv.of_type("done")], [""])
        # the new connection works both ways
        srv.send({"type": "checkpoint", "id": "new", "reason": "manual", "dir": self.tmp})
        self.pending(a)
        a.poll(14).done(14)
        self.assertEqual(srv.wait_message("done", count=2)[1]["id"], "new")
        # right after the new hello: a progress with the last step seen before the reconnect
        with srv.cond:
            second = [i for i, m in enumerate(srv.received) if m.get("type") == "hello"][1]
            nxt = srv.received[second + 1]
            # 12 = last step before the reconnect; 13 if poll(13) coalesced it first
            self.assertEqual(nxt["type"], "progress")
            self.assertIn(nxt["step"], (12, 13))

    def test_reconnect_after_long_outage(self):
        srv = self.server()
        a = self.connect()
        srv.wait_message("hello")
        srv.stop()
        self.assertTrue(wait_agent(a, lambda: not a.connected))
        self.assertIsNone(a.poll(1))
        srv.start()
        srv.wait_message("hello", count=2)
        srv.send({"type": "stop", "reason": "manual"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))

    def test_close_is_idempotent_and_context_manager(self):
        srv = self.server()
        with self.connect() as a:
            a.checkpoint_done(1, "/x")
        self.assertEqual(srv.wait_message("done")[0]["step"], 1)  # flushed on close
        a.close()
        self.assertTrue(srv.wait_for(lambda: True))


class TestParseTime(unittest.TestCase):
    def test_formats(self):
        utc = datetime.timezone.utc
        self.assertEqual(parse_time("2024-05-06T07:08:09Z"), datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=utc))
        self.assertEqual(parse_time("2024-05-06T07:08:09.5Z"), datetime.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=utc))
        self.assertEqual(parse_time("2024-05-06T07:08:09.123456789-01:30"),
                         datetime.datetime(2024, 5, 6, 8, 38, 9, 123456, tzinfo=utc))
        self.assertIsNone(parse_time(None))
        self.assertIsNone(parse_time(""))
        self.assertIsNone(parse_time("0001-13-01T00:00:00Z"))
        self.assertIsNone(parse_time(12))


if __name__ == "__main__":
    unittest.main()


class TestSigterm(Base):
    def test_noop_agent_stops_cleanly_on_sigterm(self):
        import signal as _signal

        old = _signal.getsignal(_signal.SIGTERM)
        self.addCleanup(_signal.signal, _signal.SIGTERM, old)
        agent = spotagent.connect(handle_sigterm=True)
        self.assertIsNone(agent.poll(1))
        self.assertFalse(agent.should_stop)
        os.kill(os.getpid(), _signal.SIGTERM)
        self.assertIsNone(agent.poll(2))
        self.assertTrue(agent.should_stop)
        self.assertEqual(agent.stop_reason, "shutdown")


class TestSigtermDuringInterruption(Base):
    """A node drain on the same spot notice: SIGTERM reaches the trainer
    while the agent's interruption checkpoint is in flight."""

    def setUp(self):
        Base.setUp(self)
        import signal as _signal

        old = _signal.getsignal(_signal.SIGTERM)
        self.addCleanup(_signal.signal, _signal.SIGTERM, old)

    def sigterm(self):
        import signal as _signal

        os.kill(os.getpid(), _signal.SIGTERM)

    def test_in_flight_no_second_checkpoint(self):
        srv = self.server()
        a = self.connect(handle_sigterm=True)
        a.sigterm_wait = 30.0
        dl = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=20)).isoformat()
        srv.send({"type": "checkpoint", "id": "int1", "reason": "interruption", "dir": self.tmp, "deadline": dl})
        self.pending(a)
        self.sigterm()
        req = a.poll(5)  # the interruption request, not a SIGTERM one
        self.assertIsNotNone(req)
        self.assertEqual((req.id, req.reason), ("int1", "interruption"))
        t0 = time.monotonic()
        req.done(5)  # returns at once: nothing waits for a second commit
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertEqual(srv.wait_message("done")[0]["id"], "int1")
        self.assertIsNone(a.poll(6))
        self.assertFalse(a.should_stop)  # the agent's stop ends it, after its commit
        srv.send({"type": "committed", "id": "int1", "uri": "file:///s/int1"})
        srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        self.assertEqual(a.exit_code, 75)
        # Exactly one done: no unsolicited SIGTERM checkpoint was reported.
        self.assertEqual([m.get("id") for m in srv.of_type("done")], ["int1"])

    def test_after_commit_no_second_checkpoint(self):
        srv = self.server()
        a = self.connect(handle_sigterm=True)
        srv.send({"type": "checkpoint", "id": "int2", "reason": "interruption", "dir": self.tmp})
        self.pending(a)
        a.poll(3).done(3)
        srv.wait_message("done")
        srv.send({"type": "committed", "id": "int2", "uri": "file:///s/int2"})
        srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_agent(a, lambda: a.should_stop))
        self.sigterm()
        self.assertIsNone(a.poll(4))
        self.assertEqual(len(srv.of_type("done")), 1)
        self.assertEqual(a.exit_code, 75)

    def test_folded_sigterm_stops_when_no_stop_comes(self):
        srv = self.server()
        a = self.connect(handle_sigterm=True)
        past = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=10)).isoformat()
        srv.send({"type": "checkpoint", "id": "int3", "reason": "interruption", "dir": self.tmp, "deadline": past})
        self.pending(a)
        a.sigterm_wait = 0.2  # bounds the fold: the agent never sends stop here
        self.sigterm()
        a.poll(3).done(3)
        srv.wait_message("done")
        deadline = time.monotonic() + DEADLINE
        while not a.should_stop and time.monotonic() < deadline:
            time.sleep(0.02)  # should_stop is computed on read: poll it, bounded
        self.assertTrue(a.should_stop)
        self.assertEqual(a.exit_code, 75)
        self.assertEqual(len(srv.of_type("done")), 1)

    def test_without_interruption_sigterm_still_checkpoints(self):
        srv = self.server()
        a = self.connect(handle_sigterm=True)
        a.sigterm_wait = 0.1
        self.sigterm()
        req = a.poll(7)
        self.assertIsNotNone(req)
        self.assertEqual(req.reason, "shutdown")
        req.done(7)
        self.assertEqual(srv.wait_message("done")[0]["id"], "")
        self.assertTrue(a.should_stop)
        self.assertEqual(a.exit_code, 75)

    def test_ranks_without_agreement_take_their_own(self):
        # sync_every=0: each rank of a larger world is a single trainer
        # (docs/distributed.md): its SIGTERM checkpoint is its own, never
        # a join with an id of its own, which the other ranks' joins would
        # supersede at the agent. Only a world of one offers a join.
        srv = self.server(join_dir=os.path.join(self.tmp, "job"))
        a = self.connect(handle_sigterm=True, rank=0, world_size=2, sync_every=0)
        a.sigterm_wait = 0.1
        self.sigterm()
        req = a.poll(7)
        self.assertIsNotNone(req)
        self.assertEqual(req.reason, "shutdown")
        self.assertEqual(srv.of_type("join"), [])
        req.done(7)
        self.assertEqual(srv.wait_message("done")[0]["id"], "")


BAD_RUN_ID = {"type": "error", "error": "hello: run_id \"../x\" refused: node mode needs a run id of "
                                        "letters, digits, '-', '_' and '.'"}
BUSY = {"type": "error", "error": "hello: run run-42 is busy (its queue is full); try again"}


class TestRefusedHello(Base):
    """Issue 24 item 8: a node agent's refusal of hello that cannot heal
    fails loudly (node.go's wording); one that heals is retried."""

    def test_permanent_refusal_raises_from_connect(self):
        self.server(welcome=BAD_RUN_ID)
        import io

        with mock.patch.object(sys, "stderr", io.StringIO()):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect(run_id="../x")
        self.assertIn("node mode needs a run id", cm.exception.error)

    def test_opt_out_by_env_trains_on_without_an_agent(self):
        srv = self.server(welcome=BAD_RUN_ID)
        os.environ["SPOTAGENT_ALLOW_UNPROTECTED"] = "1"
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            a = self.connect(run_id="../x")
        self.assertTrue(a._transport.refused)
        self.assertFalse(a.enabled)
        self.assertIsNone(a.poll(1))
        self.assertIn("running WITHOUT an agent", err.getvalue())
        self.assertEqual(len(srv.of_type("hello")), 1)  # no reconnecting to a refusal that cannot heal

    def test_refusal_after_connect_is_raised_by_the_next_poll(self):
        srv = self.server(welcome=None)  # the node agent is still restoring: no answer yet
        import io

        a = self.connect(run_id="run-42", welcome_timeout=0.2)
        self.assertIsNone(a.poll(1))
        srv.wait_message("hello")
        with mock.patch.object(sys, "stderr", io.StringIO()):
            srv.send({"type": "error", "error": "run could not start: store s3://b/run-42: access denied"})
            self.assertTrue(wait_agent(a, lambda: a._transport.refusal is not None))
        for _ in range(2):  # every call, until the trainer gives up
            with self.assertRaises(spotagent.AgentRefused):
                a.poll(2)

    def test_healable_refusal_is_retried_then_welcomed(self):
        srv = self.server(welcome=BUSY)
        import io

        with mock.patch.object(sys, "stderr", io.StringIO()):
            a = self.connect(run_id="run-42", welcome_timeout=0)
            srv.wait_message("hello", count=2)  # reconnected after the refusal
            srv.welcome = WELCOME
            self.assertTrue(a.wait_welcome(DEADLINE))
        self.assertIsNone(a.poll(1))
        self.assertEqual(a.resume_step, 120)

    def test_healable_refusal_that_lasts_becomes_permanent(self):
        os.environ["SPOTAGENT_REFUSED_TIMEOUT"] = "0.3"
        self.server(welcome=BUSY)
        import io

        with mock.patch.object(sys, "stderr", io.StringIO()):
            a = self.connect(run_id="run-42", welcome_timeout=0)
            self.assertTrue(wait_agent(a, lambda: a._transport.refusal is not None))
        with self.assertRaises(spotagent.AgentRefused) as cm:
            a.poll(1)
        self.assertIn("still refused", str(cm.exception))

    def test_explicit_permanent_field_wins(self):
        from spotagent.client import refusal_is_permanent

        self.assertTrue(refusal_is_permanent(BAD_RUN_ID))
        self.assertFalse(refusal_is_permanent(BUSY))
        self.assertFalse(refusal_is_permanent({"error": "hello: run_id \"a\" refused: it is in use by another pod "
                                                        "or user on this node (1 connections); it frees once they close"}))
        self.assertFalse(refusal_is_permanent({"error": "too many connections (64): closing; try again later"}))
        self.assertTrue(refusal_is_permanent(dict(BUSY, permanent=True)))
        self.assertFalse(refusal_is_permanent(dict(BAD_RUN_ID, permanent=False)))


class TestBadNumbers(Base):
    """Issue 36 item 5: the agent refuses a message with a number out of
    bounds (pkg/protocol validate.go; the fake answers as it does, held by
    golden/bad_numbers*.jsonl). A refused hello fails as loudly as any
    permanent refusal, naming the field and where the client took it from;
    a step the agent would refuse is never sent."""

    def test_hello_with_rank_beyond_world_size_raises_from_connect(self):
        self.server()
        os.environ.update(RANK="2", WORLD_SIZE="2")  # a misconfigured launcher
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect()
        self.assertIn("hello: rank 2 must be below world_size 2", cm.exception.error)
        self.assertIn("rank=2 world_size=2", cm.exception.error)
        self.assertIn("WORLD_SIZE", str(cm.exception))
        self.assertIn("ERROR", err.getvalue())
        self.assertIn("rank 2 must be below world_size 2", err.getvalue())

    def test_opt_out_trains_on_and_says_so_once(self):
        srv = self.server()
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            a = self.connect(rank=0, world_size=0, allow_unprotected=True)
            self.assertIsNone(a.poll(1))
            self.assertIsNone(a.poll(2))
        self.assertFalse(a.enabled)
        self.assertEqual(err.getvalue().count("running WITHOUT an agent"), 1, err.getvalue())
        self.assertIn("hello: world_size 0 out of range (1..1048576)", err.getvalue())
        self.assertEqual(len(srv.of_type("hello")), 1)  # no reconnecting to a refusal that cannot heal

    def test_bad_step_in_poll_is_not_sent_and_said_once(self):
        srv = self.server()
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            a = self.connect(progress_interval=0)
            for bad in (-1, 2 ** 53 + 1, "x", -5):
                self.assertIsNone(a.poll(bad))
            self.assertIsNone(a.poll(7))
            srv.wait_for(lambda: any(m.get("step") == 7 for m in srv.received))
        self.assertEqual(err.getvalue().count("poll(step="), 1, err.getvalue())
        self.assertIn("poll(step=-1)", err.getvalue())
        self.assertEqual([m["step"] for m in srv.of_type("progress")], [7])
        self.assertFalse(a._transport.refused)
        self.assertEqual(a._state.last_step, 7)

    def test_done_with_bad_step_raises_in_the_caller(self):
        srv = self.server(commit=True)
        a = self.connect()
        srv.send({"type": "checkpoint", "id": "c1", "reason": "manual", "dir": self.tmp})
        self.pending(a)
        req = a.poll(3)
        for bad in (-1, 2 ** 53 + 1, None):
            with self.assertRaises(ValueError) as cm:
                req.done(bad)
            self.assertIn("out of range", str(cm.exception))
        with self.assertRaises(ValueError):
            a.checkpoint_done(-2, self.tmp)
        req.done(3)  # the request is still open: the bad calls sent nothing
        self.assertEqual(a.wait_committed("c1", DEADLINE).step, 3)
        self.assertEqual([m["step"] for m in srv.of_type("done")], [3])

    def test_error_about_another_message_before_welcome_is_no_refusal(self):
        # A node agent welcomes once it restored the run; an error about a
        # progress sent meanwhile is not the hello's answer.
        srv = self.server(welcome=None)
        a = self.connect(welcome_timeout=0.2)
        srv.wait_message("hello")
        srv.send({"type": "error", "error": "progress: step 9007199254740993 too large (at most 9007199254740992)"})
        srv.send(WELCOME)
        self.assertTrue(a.wait_welcome(DEADLINE))
        self.assertFalse(a._transport.refused)
        self.assertIsNone(a.poll(1))

    def test_first_refusal_stands(self):
        srv = self.server(welcome=None)
        import io

        a = self.connect(welcome_timeout=0.2)
        srv.wait_message("hello")
        with mock.patch.object(sys, "stderr", io.StringIO()):
            srv.send(b'{"type":"error","error":"hello: rank 2 must be below world_size 2"}\n'
                     b'{"type":"error","error":"run could not start: later"}\n')
            self.assertTrue(wait_agent(a, lambda: a._transport.refusal is not None))
        with self.assertRaises(spotagent.AgentRefused) as cm:
            a.poll(1)
        self.assertIn("rank 2 must be below world_size 2", cm.exception.error)
        self.assertEqual(cm.exception.path, self.sock)


class TestPeerCredentials(Base):
    """The client trusts an agent only when SO_PEERCRED names the expected
    uid: $SPOTAGENT_AGENT_UID, else itself or root."""

    @unittest.skipUnless(hasattr(__import__("socket"), "SO_PEERCRED"), "SO_PEERCRED is Linux only")
    def test_refuses_agent_of_another_uid(self):
        os.environ["SPOTAGENT_AGENT_UID"] = str(os.getuid() + 4242)
        srv = self.server()
        import io

        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect(welcome_timeout=2.0)
        self.assertIn("expected %d" % (os.getuid() + 4242), str(cm.exception))
        self.assertIn("SPOTAGENT_ALLOW_UNPROTECTED", str(cm.exception))
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            a = self.connect(welcome_timeout=2.0, allow_unprotected=True)
            self.assertTrue(wait_agent(a, lambda: a._transport.refused))
        self.assertFalse(a.enabled)
        self.assertIsNone(a.resume_dir)  # the welcome's resume was never trusted
        self.assertIsNone(a.poll(1))
        self.assertIn("refusing the agent", err.getvalue())
        self.assertIn("expected %d" % (os.getuid() + 4242), err.getvalue())
        self.assertEqual(srv.of_type("hello"), [])  # not even a hello was sent

    def test_accepts_expected_uid(self):
        os.environ["SPOTAGENT_AGENT_UID"] = str(os.geteuid())
        self.server()
        a = self.connect()
        self.assertTrue(a.enabled)
        self.assertEqual(a.resume_step, 120)

    def test_default_accepts_own_uid(self):
        self.server()
        a = self.connect()
        self.assertEqual(a.run_id, "run-42")
