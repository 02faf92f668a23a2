"""The Python client against the real agent binary (tests/realagent.py):
where the fake could disagree with the agent, the agent decides."""

import io
import json
import logging
import os
import subprocess
import sys
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import spotagent  # noqa: E402
from realagent import NodeAgent, binary  # noqa: E402
from test_client import Base, wait_agent  # noqa: E402
from test_dist import GlooBase  # noqa: E402


class FakePath(object):
    """What GlooBase.start takes for SOCKET: anything with .path."""

    def __init__(self, path: str) -> None:
        self.path = path


class TestNodeRefusedHello(Base):
    """Issue 24 item 8: `spotagent node` refuses SPOTAGENT_RUN_ID=../x; the
    trainer must not train on unprotected without saying so."""

    def setUp(self):
        Base.setUp(self)
        self.node = NodeAgent(self.tmp)

    def tearDown(self):
        for a in self.agents:  # before the agent stops: it would wait for a shutdown checkpoint
            a.close(timeout=1.0)
        self.node.stop()
        Base.tearDown(self)

    def test_bad_run_id_raises_from_connect(self):
        with mock.patch.object(sys, "stderr", io.StringIO()):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect(path=self.node.socket, run_id="../x", welcome_timeout=10)
        self.assertIn("refused", cm.exception.error)
        self.assertIn("run id", cm.exception.error)

    def test_bad_numbers_in_hello_raise_from_connect(self):
        """Issue 36 item 5: the agent refuses a hello whose rank is not
        below its world_size (a misconfigured launcher); the trainer fails
        at connect() with the agent's words and where the numbers came from,
        instead of training for hours with nothing checkpointed."""
        os.environ.update(RANK="2", WORLD_SIZE="2")
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            with self.assertRaises(spotagent.AgentRefused) as cm:
                self.connect(path=self.node.socket, run_id="exp-1", welcome_timeout=10)
        self.assertIn("hello: rank 2 must be below world_size 2", cm.exception.error)
        self.assertIn("rank=2 world_size=2", cm.exception.error)
        self.assertIn("refused this trainer: hello: rank 2 must be below world_size 2", err.getvalue())

    def test_bad_step_never_reaches_the_agent(self):
        """poll(-1) sends no progress the agent would refuse (an id-less error
        would otherwise be logged every progress_interval); done(-1) raises."""
        a = self.connect(path=self.node.socket, run_id="exp-1", welcome_timeout=10, progress_interval=0)
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            for _ in range(3):
                self.assertIsNone(a.poll(-1))
            self.assertIsNone(a.poll(2 ** 53 + 1))
        self.assertEqual(err.getvalue().count("poll(step="), 1, err.getvalue())
        with self.assertRaises(ValueError):
            a.checkpoint_done(-1, os.path.join(self.tmp, "x"))
        # The agent's errors come in order: once it answered an unsolicited
        # done of a missing directory, it would have answered a progress -1.
        seen = []  # type: list
        handler = logging.Handler()
        handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore
        logger = logging.getLogger("spotagent")
        logger.addHandler(handler)
        self.addCleanup(logger.removeHandler, handler)
        logger.setLevel(logging.WARNING)
        a.checkpoint_done(5, os.path.join(self.tmp, "missing"))
        self.assertTrue(wait_agent(a, lambda: any("done" in m for m in seen)), seen)
        self.assertEqual([m for m in seen if "progress" in m], [])
        self.assertFalse(a._transport.refused)

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


class Sidecar(object):
    """``spotagent sidecar --node-rank K``: node K's agent of a multi-node job."""

    def __init__(self, tmp: str, k: int, store: str, single: bool = False) -> None:
        self.socket = os.path.join(tmp, "node%d.sock" % k)
        self.log_path = os.path.join(tmp, "node%d.log" % k)
        args = [binary(), "sidecar", "--cloud", "none", "--store", store, "--run-id", "job",
                "--node-rank", str(k), "--socket", self.socket, "--checkpoint-dir", os.path.join(tmp, "ck%d" % k),
                "--interval", "1h", "--log-format", "json"]
        if single:  # a single-node sidecar: no --node-rank
            args[args.index("--node-rank"):args.index("--node-rank") + 2] = []
        env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true")
        env = {key: v for key, v in env.items() if not key.startswith("SPOTAGENT_")}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError("sidecar %d did not listen:\n%s" % (k, self.log()))
            time.sleep(0.02)  # polling for a file the agent creates, with a deadline

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class TestSigtermOwnCheckpointUnderPart(Base):
    """A single-process trainer under a part agent (`sidecar --node-rank 0`:
    a TrainJob of 1 node x 1 process, or a trainer without torch.distributed)
    that takes its own SIGTERM checkpoint: the agent refuses it (a part
    commits only what every rank saves when its agent asks) and says so in
    its log; the trainer stops waiting at the refusal, not at the end of
    SPOTAGENT_SIGTERM_WAIT, and says it was not committed (issue 45: it
    waited the whole 40 s and the operator saw nothing)."""

    def test_refusal_is_said_and_ends_the_wait(self):
        import signal as _signal

        old = _signal.getsignal(_signal.SIGTERM)
        self.addCleanup(_signal.signal, _signal.SIGTERM, old)
        node = Sidecar(self.tmp, 0, "file://" + os.path.join(self.tmp, "store"))
        self.addCleanup(node.stop)
        a = self.connect(path=node.socket, handle_sigterm=True, welcome_timeout=20)
        a.sigterm_wait = 60.0
        os.kill(os.getpid(), _signal.SIGTERM)
        req = a.poll(7)
        self.assertIsNotNone(req)
        self.assertEqual(req.reason, "shutdown")
        with open(os.path.join(req.dir, "model.bin"), "wb") as f:
            f.write(b"x" * 1024)
        logger = logging.getLogger("spotagent")
        with self.assertLogs(logger, level="WARNING") as logs:
            t0 = time.monotonic()
            req.done(7)
            took = time.monotonic() - t0
        self.assertLess(took, 30.0, "done waited for a commit the agent had refused")
        self.assertTrue(any("refused by the agent, not committed" in line for line in logs.output), logs.output)
        self.assertTrue(a.should_stop)
        end = time.monotonic() + 20
        while "checkpoint refused: not committed" not in node.log() and time.monotonic() < end:
            time.sleep(0.05)  # the agent's log is a file it appends to: polled, bounded
        self.assertIn("checkpoint refused: not committed", node.log())


class TestSigtermJoinUnderPart(Base):
    """A single process that says its rank under a part agent (torchrun
    with one node of one process: a TrainJob of 1 x 1, RANK=0,
    WORLD_SIZE=1) gets SIGTERM: it offers its checkpoint to the agent as
    the job's (join), the agent asks for it and commits it as the job's
    checkpoint, and the trainer stops once it is committed. Before, it took
    its own, which the part agent refused: nothing committed (issue 45's
    known limitation). A whole-checkpoint agent refuses the join of a
    world of one at once, and the trainer takes its own as before
    (TestSigtermDuringAgentsStop, TestSigtermOwnCheckpointUnderPart)."""

    def test_join_commits_the_job_checkpoint(self):
        import signal as _signal

        old = _signal.getsignal(_signal.SIGTERM)
        self.addCleanup(_signal.signal, _signal.SIGTERM, old)
        store = os.path.join(self.tmp, "store")
        node = Sidecar(self.tmp, 0, "file://" + store)
        self.addCleanup(node.stop)
        a = self.connect(path=node.socket, handle_sigterm=True, welcome_timeout=20, rank=0, world_size=1)
        a.sigterm_wait = 60.0
        os.kill(os.getpid(), _signal.SIGTERM)
        req = a.poll(7)
        self.assertIsNotNone(req)
        self.assertEqual(req.reason, "shutdown")
        self.assertRegex(req.id, "^[0-9a-f]{12}$", "not the agent's request")
        with open(os.path.join(req.dir, "model.bin"), "wb") as f:
            f.write(b"x" * 1024)
        req.done(7)
        self.assertIsNotNone(a.wait_committed(req.id, timeout=30), node.log())
        self.assertTrue(wait_agent(a, lambda: a.should_stop), "no stop after the commit")
        self.assertNotIn("checkpoint refused", node.log())
        latest = os.path.join(store, "latest.json")
        self.assertTrue(os.path.exists(latest), node.log())
        with open(latest) as f:
            self.assertEqual(json.load(f)["step"], 7)


class TestSigtermDuringAgentsStop(Base):
    """SIGTERM reaches the trainer (a pod deletion) and, while it saves its
    own checkpoint, the sidecar starts its own stop sequence (the spot notice
    it watches for; here its SIGTERM) and asks for the interruption
    checkpoint. The agent refuses the trainer's own as "in progress": the
    trainer answers the agent's request instead of stopping, and that one is
    committed. Before, it stopped at the refusal (75, "refused, not
    committed") and left the agent's request unanswered: nothing committed."""

    def test_own_checkpoint_refused_in_progress_answers_the_agents(self):
        import signal as _signal

        old = _signal.getsignal(_signal.SIGTERM)
        self.addCleanup(_signal.signal, _signal.SIGTERM, old)
        node = Sidecar(self.tmp, 0, "file://" + os.path.join(self.tmp, "store"), single=True)
        self.addCleanup(node.stop)
        a = self.connect(path=node.socket, handle_sigterm=True, welcome_timeout=20)
        a.sigterm_wait = 60.0
        os.kill(os.getpid(), _signal.SIGTERM)
        req = a.poll(7)
        self.assertIsNotNone(req)
        node.proc.send_signal(_signal.SIGTERM)  # the agent's own stop, while the trainer saves
        self.assertTrue(wait_agent(a, lambda: a._state.urgent is not None), "the agent's request never arrived")
        with open(os.path.join(req.dir, "model.bin"), "wb") as f:
            f.write(b"x" * 1024)
        t0 = time.monotonic()
        req.done(7)
        self.assertLess(time.monotonic() - t0, 30.0, "done waited for a commit the agent had refused")
        self.assertFalse(a.should_stop, "stopped with the agent's interruption checkpoint unanswered")
        ask = a.poll(8)
        self.assertIsNotNone(ask, "the agent's interruption checkpoint was not handed out")
        self.assertEqual(ask.reason, "shutdown")
        with open(os.path.join(ask.dir, "model.bin"), "wb") as f:
            f.write(b"y" * 1024)
        ask.done(8)
        self.assertIsNotNone(a.wait_committed(ask.id, timeout=30), node.log())
        self.assertTrue(wait_agent(a, lambda: a.should_stop), "no stop after the commit")
        self.assertEqual(a.exit_code, 75)


class TestSigtermRealSidecars(GlooBase):
    """Issue 24 item 1, with the real agent: two sidecars (--node-rank 0/1),
    a 2-rank gloo job, SIGTERM (SPOTAGENT_HANDLE_SIGTERM=1) to rank 1. The
    shutdown checkpoint offered to the job carries a deadline, both agents
    take the join, the job checkpoint commits, and every rank stops with 75.
    Before the fix every rank got "join: a deadline in the future is
    required" and the store stayed empty."""

    def test_sigterm_on_one_rank_commits_a_job_checkpoint(self):
        store = os.path.join(self.tmp, "store")
        nodes = [Sidecar(self.tmp, k, "file://" + store) for k in (0, 1)]
        for n in nodes:
            self.addCleanup(n.stop)
        common = {"GROUP_WORLD_SIZE": 2, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "DW_AFTER": 50,
                  "SPOTAGENT_ALLOW_UNPROTECTED": 0}
        self.start([dict(common, SOCKET=FakePath(nodes[0].socket), GROUP_RANK=0),
                    dict(common, SOCKET=FakePath(nodes[1].socket), GROUP_RANK=1, DW_SIGTERM_AT=2,
                         SPOTAGENT_HANDLE_SIGTERM=1)])
        outs = self.finish()
        logs = "\n".join(n.log()[-3000:] for n in nodes)
        evs = [o["events"] for o in outs]
        self.assertEqual([len(e) for e in evs], [1, 1], logs)
        self.assertEqual(len({(e[0]["id"], e[0]["step"], e[0]["reason"]) for e in evs}), 1, evs)
        self.assertEqual(evs[0][0]["reason"], "shutdown")
        self.assertIsNotNone(evs[0][0]["deadline"])
        self.assertNotIn("deadline in the future is required", logs + "".join(o["stderr"] for o in outs))
        self.assertEqual([o["exit_code"] for o in outs], [75, 75], logs)
        with open(os.path.join(store, "latest.json")) as f:
            latest = json.load(f)
        self.assertEqual(latest.get("step"), evs[0][0]["step"], latest)
