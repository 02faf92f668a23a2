"""The ranks of a torch.distributed job agree on every checkpoint (issue 15).

Unit tests drive the agreement with a stand-in for the collective; the
TestGloo cases run real 2-rank gloo jobs (tests/distworker.py under
/usr/bin/python3, Debian's python3-torch), each rank with its own fake agent.
If torch.distributed is not importable there, those FAIL unless
SPOTAGENT_ALLOW_NO_TORCH=1.
"""

import datetime
import io
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import spotagent  # noqa: E402
from spotagent import dist as sdist  # noqa: E402
from spotagent.client import parse_time  # noqa: E402
from fakeagent import DEADLINE, FakeAgent  # noqa: E402
from test_client import WELCOME, Base, wait_agent  # noqa: E402

TORCH_PYTHON = os.environ.get("SPOTAGENT_TORCH_PYTHON", "/usr/bin/python3")
WORKER = os.path.join(HERE, "distworker.py")
STARTUP = 300  # seconds a rank may take to start: see GlooBase.wait_line
UTC = datetime.timezone.utc


class TestEncoding(unittest.TestCase):
    def test_ids(self):
        self.assertEqual(sdist.parse_id("00000000abcd"), 0xABCD)
        self.assertEqual(sdist.format_id(0xABCD), "00000000abcd")
        for bad in ("", "abc", "ABCDEF012345", "0123456789abc", "zzzzzzzzzzzz", "-12345678901"):
            self.assertIsNone(sdist.parse_id(bad), bad)

    def test_max_is_urgency_then_id_and_min_deadline(self):
        t1 = datetime.datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
        t2 = t1 + datetime.timedelta(seconds=30)
        periodic = sdist.encode(1, 0xFFFFFFFFFFFF, t1)
        interruption = sdist.encode(4, 1, t2)
        other = sdist.encode(4, 2, None)
        got = (max(periodic[0], interruption[0], other[0]), max(periodic[1], interruption[1], other[1]))
        self.assertEqual(sdist.decode(got), (4, 2, t1))
        self.assertEqual(sdist.decode(sdist.NOTHING), (0, 0, None))


class FakeDist(types.ModuleType):
    """A stand-in torch.distributed: what Sync.detect asks of it."""

    def __init__(self, backend="nccl", world=4):
        types.ModuleType.__init__(self, "torch.distributed")
        self.backend, self.world, self.initialised = backend, world, False
        self.group = types.SimpleNamespace(WORLD=object())
        self.new_groups = []

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialised

    def get_world_size(self, group=None):
        return self.world

    def get_backend(self, group=None):
        return self.backend

    def get_rank(self, group=None):
        return 1

    def new_group(self, ranks=None, backend=None):
        self.new_groups.append((ranks, backend))
        return "gloo-group"


class TestDetect(unittest.TestCase):
    def modules(self, fake):
        return mock.patch.dict(sys.modules, {"torch.distributed": fake, "torch": types.ModuleType("torch")})

    def test_lazily_once_initialised_and_a_gloo_group_for_nccl(self):
        fake = FakeDist()
        with self.modules(fake):
            s = sdist.Sync(None, 1)
            self.assertFalse(s.detect())  # connect() before init_process_group
            fake.initialised = True
            self.assertTrue(s.detect())
            self.assertTrue(s.detect())
        self.assertEqual(fake.new_groups, [(None, "gloo")])  # created once, on every rank at this call
        self.assertEqual(s._group, "gloo-group")
        self.assertEqual((s.rank, s.world_size), (1, 4))

    def test_gloo_group_used_as_is_and_world_one_stays_off(self):
        fake = FakeDist(backend="gloo", world=1)
        fake.initialised = True
        with self.modules(fake):
            s = sdist.Sync(None, 1)
            self.assertFalse(s.detect())
            fake.world = 2
            self.assertTrue(s.detect())
        self.assertEqual(fake.new_groups, [])
        self.assertIs(s._group, fake.group.WORLD)

    def test_a_users_group_on_a_mixed_backend_gets_a_gloo_group_over_its_ranks(self):
        # torch 2's per-device backend string is not "gloo": the agreement
        # makes its own gloo group, over the ranks of the user's group,
        # asked through the public get_process_group_ranks (#39).
        fake = FakeDist(backend="cpu:gloo,cuda:nccl")
        fake.initialised = True
        fake.get_process_group_ranks = lambda pg: [3, 1] if pg == "users" else []
        with self.modules(fake):
            s = sdist.Sync("users", 1)
            self.assertTrue(s.detect())
        self.assertEqual(fake.new_groups, [([1, 3], "gloo")])

    def test_group_ranks_falls_back_to_torch_1_13s_map(self):
        fake = FakeDist()
        fake.distributed_c10d = types.SimpleNamespace(_pg_group_ranks={"users": {5: 1, 2: 0}})
        self.assertEqual(sdist.group_ranks(fake, "users"), [2, 5])

    def test_group_ranks_of_the_real_torch(self):
        # Whatever torch TORCH_PYTHON has (1.13 here: the private map; 2.x:
        # the public call), a group of ranks [0] answers [0].
        code = ("import sys, tempfile, os; sys.path.insert(0, %r)\n"
                "import torch.distributed as d\n"
                "from spotagent import dist as sd\n"
                "f = os.path.join(tempfile.mkdtemp(), 'store')\n"
                "d.init_process_group('gloo', init_method='file://' + f, rank=0, world_size=1)\n"
                "g = d.new_group(ranks=[0], backend='gloo')\n"
                "print(sd.group_ranks(d, g), hasattr(d, 'get_process_group_ranks'))\n" % os.path.join(HERE, ".."))
        r = subprocess.run([TORCH_PYTHON, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertTrue(r.stdout.decode().startswith("[0] "), r.stdout.decode())

    def test_without_torch_loaded_nothing_is_imported(self):
        with mock.patch.dict(sys.modules, {"torch.distributed": None}):
            del sys.modules["torch.distributed"]
            s = sdist.Sync(None, 1)
            self.assertFalse(s.detect())
            self.assertNotIn("torch.distributed", sys.modules)


    def test_sync_every_zero_turns_it_off(self):
        fake = FakeDist(backend="gloo")
        fake.initialised = True
        with self.modules(fake), mock.patch.dict(os.environ, {"SPOTAGENT_SYNC_EVERY": "0"}):
            a = spotagent.connect(path=None)
            self.assertFalse(a._sync.detect())
            self.assertIsNone(a.poll(1))
            self.assertFalse(a._sync.active)
            self.assertTrue(spotagent.connect(path=None, sync_every=3)._sync.detect())

    def test_client_stays_standard_library_only(self):
        code = ("import sys; sys.path.insert(0, %r); import spotagent; a = spotagent.connect(path=None); "
                "[a.poll(i) for i in range(3)]; assert 'torch' not in sys.modules, 'torch imported'"
                % os.path.join(HERE, ".."))
        r = subprocess.run([TORCH_PYTHON, "-c", code], stderr=subprocess.PIPE)
        self.assertEqual(r.returncode, 0, r.stderr.decode())


class FakeSync(object):
    """The collective with one other rank whose entry is `other`."""

    def __init__(self, other=sdist.NOTHING, every=1):
        self.other = other
        self.every = every
        self.calls = 0
        self.active = True
        self.sent = []

    def detect(self):
        return True

    def due(self):
        self.calls += 1
        return (self.calls - 1) % self.every == 0

    fail = None  # an exception the collective raises

    def agree(self, mine, resumed=None, agent=True):
        self.sent.append(mine)
        if self.fail is not None:
            raise self.fail
        return (max(mine[0], self.other[0]), max(mine[1], self.other[1]))


GLOO_RESET = ("[./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:17794: Connection reset by peer")
GLOO_CLOSED = "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4000"
GLOO_TIMEOUT = "[./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete"


class TestPeerLoss(unittest.TestCase):
    """Which errors are a lost peer (exit 75), and which a crash (exit 1).
    The gloo messages are torch 1.13's, as a rank saw them when its peer
    was SIGKILLed (reset, closed) or SIGSTOPped (timed out)."""

    def test_gloo_and_nccl_peer_errors(self):
        for text in (GLOO_RESET, GLOO_CLOSED, GLOO_TIMEOUT,
                     "NCCL communicator was aborted on rank 3.",
                     "NCCL error: remote process exited or there was a network error"):
            self.assertTrue(sdist.is_peer_loss(RuntimeError(text)), text)

    def test_other_errors_are_not(self):
        for e in (ValueError("Connection reset by peer"), RuntimeError("Connection reset by peer"),
                  RuntimeError("CUDA out of memory"), KeyError("x"), OSError(104, "Connection reset by peer"),
                  RuntimeError("[./gloo/transport/tcp/device.cc:83] ai_family mismatch")):
            self.assertFalse(sdist.is_peer_loss(e), repr(e))

    def test_chained(self):
        try:
            try:
                raise RuntimeError(GLOO_CLOSED)
            except RuntimeError as e:
                raise KeyError("wrapped") from e
        except KeyError as e:
            self.assertTrue(sdist.is_peer_loss(e))
        self.assertTrue(sdist.is_peer_loss(sdist.PeerLost("x")))


class TestHello(Base):
    def test_node_fields_from_torchrun_env(self):
        os.environ.update({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                           "GROUP_RANK": "1", "NODE_RANK": "7", "GROUP_WORLD_SIZE": "2", "NNODES": "9"})
        srv = self.server()
        self.connect()
        hello = srv.wait_message("hello")[0]
        for k, v in {"rank": 5, "world_size": 8, "local_rank": 1, "local_world_size": 4,
                     "node_rank": 1, "nodes": 2}.items():
            self.assertEqual(hello.get(k), v, k)

    def test_rank_from_an_initialised_process_group(self):
        os.environ.update({"RANK": "7", "WORLD_SIZE": "9"})
        fake = FakeDist(backend="gloo")  # rank 1 of 4
        fake.initialised = True
        srv = self.server()
        with mock.patch.dict(sys.modules, {"torch.distributed": fake, "torch": types.ModuleType("torch")}):
            self.connect(sync_every=0)
        hello = srv.wait_message("hello")[0]
        self.assertEqual((hello["rank"], hello["world_size"]), (1, 4))

    def test_node_rank_fallbacks_and_omitted_when_unknown(self):
        os.environ.update({"NODE_RANK": "3", "NNODES": "4"})
        srv = self.server()
        self.connect()
        hello = srv.wait_message("hello")[0]
        self.assertEqual((hello.get("node_rank"), hello.get("nodes")), (3, 4))
        for k in ("local_rank", "local_world_size", "rank", "world_size"):
            self.assertNotIn(k, hello)


class TestResentCheckpoint(Base):
    def test_same_id_updates_the_pending_request_in_place(self):
        srv = self.server()
        a = self.connect()
        srv.wait_message("hello")
        srv.send({"type": "checkpoint", "id": "aaaaaaaaaaaa", "reason": "periodic", "dir": self.tmp})
        srv.send({"type": "checkpoint", "id": "aaaaaaaaaaaa", "reason": "interruption", "dir": self.tmp,
                  "deadline": "2030-01-01T00:00:00Z"})
        srv.send({"type": "checkpoint", "id": "bbbbbbbbbbbb", "reason": "periodic", "dir": self.tmp})
        self.pending(a, 2)
        self.assertTrue(wait_agent(a, lambda: a._requests[0].reason == "interruption"))
        req = a.poll(1)
        self.assertEqual((req.id, req.reason), ("aaaaaaaaaaaa", "interruption"))
        self.assertEqual(req.deadline, parse_time("2030-01-01T00:00:00Z"))
        # Re-sent after poll returned it, before done: updated, not queued.
        srv.send({"type": "checkpoint", "id": "aaaaaaaaaaaa", "reason": "shutdown", "dir": self.tmp})
        self.assertTrue(wait_agent(a, lambda: req.reason == "shutdown"))
        self.assertEqual(a.poll(2).id, "bbbbbbbbbbbb")
        self.assertIsNone(a.poll(3))


class TestAgreement(Base):
    """The client's side of the agreement, with a stand-in collective."""

    def job_agent(self, other=sdist.NOTHING, every=1, **kw):
        # A rank of a job of two, as the default group would make it: the
        # agent takes joins only from ranks of a multi-rank job.
        kw.setdefault("rank", 0)
        kw.setdefault("world_size", 2)
        a = self.connect(**kw)
        a._sync = FakeSync(other, every)
        return a

    def test_own_request_wins_and_gets_the_job_deadline(self):
        srv = self.server()
        t_other = datetime.datetime(2030, 1, 1, 0, 0, 0, tzinfo=UTC)
        a = self.job_agent(other=sdist.encode(1, 0xFFFFFFFFFFFF, t_other))
        srv.wait_message("hello")
        srv.send({"type": "checkpoint", "id": "000000000007", "reason": "interruption", "dir": self.tmp,
                  "deadline": "2031-01-01T00:00:00Z"})
        self.pending(a)
        req = a.poll(9)
        self.assertEqual((req.id, req.reason, req.deadline), ("000000000007", "interruption", t_other))
        self.assertEqual(srv.of_type("join"), [])

    def test_join_message_and_answer(self):
        srv = self.server(join_dir=os.path.join(self.tmp, "joined"))
        deadline = datetime.datetime(2030, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
        a = self.job_agent(other=sdist.encode(4, 0xABCDEF012345, deadline))
        srv.wait_message("hello")
        srv.send({"type": "checkpoint", "id": "ffffffffffff", "reason": "periodic", "dir": self.tmp})
        self.pending(a)
        req = a.poll(17)
        self.assertIsNotNone(req)
        self.assertEqual((req.id, req.reason, req.deadline), ("abcdef012345", "interruption", deadline))
        self.assertEqual(req.dir, os.path.join(self.tmp, "joined", "abcdef012345"))
        self.assertEqual(srv.of_type("join"), [{"type": "join", "id": "abcdef012345", "reason": "interruption",
                                                "deadline": "2030-01-01T00:00:01.500Z", "step": 17}])
        # The periodic request that lost was sent before the answer: dropped,
        # never answered (the agent abandoned it on join).
        a._sync.other = sdist.NOTHING
        self.assertIsNone(a.poll(18))
        req.done(17)
        srv.wait_message("done")
        self.assertEqual([m["id"] for m in srv.of_type("done") + srv.of_type("failed")], ["abcdef012345"])

    def test_no_answer_returns_none_and_says_so_once(self):
        srv = self.server()  # answers no join
        a = self.job_agent(other=sdist.encode(4, 0x123, None))
        a.join_timeout = 0.2
        srv.wait_message("hello")
        err = io.StringIO()
        with mock.patch.object(sys, "stderr", err):
            self.assertIsNone(a.poll(1))
            self.assertIsNone(a.poll(2))  # agreed again (still pending elsewhere)
        self.assertEqual(len(srv.wait_message("join", 2)), 2)
        self.assertEqual(err.getvalue().count("takes no part in the job's checkpoint 000000000123"), 1)

    def test_join_refused_by_the_agent_returns_at_once(self):
        srv = self.server()
        a = self.job_agent(other=sdist.encode(4, 0x123, None))
        a.join_timeout = DEADLINE * 3  # the error must end the wait, not this
        srv.wait_message("hello")
        # The agent's error comes before the join: it is recorded by id.
        srv.send({"type": "error", "id": "000000000123", "error": "cannot"})
        self.assertTrue(wait_agent(a, lambda: "000000000123" in a._errors))
        t0 = time.monotonic()
        with mock.patch.object(sys, "stderr", io.StringIO()):
            self.assertIsNone(a.poll(1))
        self.assertLess(time.monotonic() - t0, DEADLINE)

    def test_never_waits_past_the_deadline(self):
        self.server()
        past = datetime.datetime.now(UTC) - datetime.timedelta(seconds=1)
        a = self.job_agent(other=sdist.encode(4, 0x123, past))
        with mock.patch.object(sys, "stderr", io.StringIO()):
            self.assertIsNone(a.poll(1))
        self.assertEqual(self.servers[0].of_type("join"), [])

    def test_no_agent_takes_part_in_the_collective(self):
        a = self.connect(path=None)
        a._sync = FakeSync(other=sdist.encode(4, 0x123, None))
        with mock.patch.object(sys, "stderr", io.StringIO()) as err:
            self.assertIsNone(a.poll(1))
        self.assertEqual(a._sync.sent, [sdist.NOTHING])
        self.assertIn("no agent", err.getvalue())

    def test_requests_only_at_sync_calls(self):
        srv = self.server()
        a = self.job_agent(every=3)
        srv.wait_message("hello")
        self.assertIsNone(a.poll(1))  # a sync, before the request came
        srv.send({"type": "checkpoint", "id": "000000000042", "reason": "periodic", "dir": self.tmp})
        self.pending(a)
        self.assertIsNone(a.poll(2))
        self.assertIsNone(a.poll(3))
        self.assertEqual(a.poll(4).id, "000000000042")
        self.assertEqual(len(a._sync.sent), 2)

    def test_stop_is_agreed_and_latched(self):
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_agent(a, lambda: a._should_stop))
        self.assertFalse(a.should_stop)  # not before the job agreed
        self.assertEqual(a.exit_code, 0)
        self.assertIsNone(a.poll(1))
        self.assertEqual(a._sync.sent[-1][0] >> sdist.ID_BITS, sdist.STOP)
        self.assertTrue(a.should_stop)
        self.assertEqual((a.stop_reason, a.exit_code), ("interruption", spotagent.EXIT_INTERRUPTED))

    def test_another_ranks_stop_stops_this_one(self):
        self.server()
        a = self.job_agent(other=((sdist.STOP << sdist.ID_BITS) | sdist.STOP_CODES["shutdown"], sdist.NO_DEADLINE))
        self.assertFalse(a.should_stop)
        self.assertIsNone(a.poll(1))
        self.assertTrue(a.should_stop)
        self.assertEqual((a.stop_reason, a.exit_code), ("shutdown", spotagent.EXIT_INTERRUPTED))

    def test_a_fenced_rank_stops_the_job_with_76(self):
        # #36 item 1: one rank's agent was fenced: the job stops (fenced
        # wins the agreement's reason), that rank exits 76; a rank whose own
        # agent was not fenced exits 75: the job runs again, with the newer copy.
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        srv.send({"type": "stop", "reason": "fenced"})
        self.assertTrue(wait_agent(a, lambda: a._should_stop))
        self.assertIsNone(a.poll(1))
        self.assertEqual(a._sync.sent[-1], ((sdist.STOP << sdist.ID_BITS) | sdist.STOP_CODES["fenced"], sdist.NO_DEADLINE))
        self.assertEqual((a.stop_reason, a.exit_code), ("fenced", spotagent.EXIT_FENCED))
        self.server()
        b = self.job_agent(other=((sdist.STOP << sdist.ID_BITS) | sdist.STOP_CODES["fenced"], sdist.NO_DEADLINE))
        self.assertIsNone(b.poll(1))
        self.assertEqual((b.stop_reason, b.exit_code), ("fenced", spotagent.EXIT_INTERRUPTED))
        self.assertGreater(sdist.STOP_CODES["fenced"], sdist.STOP_CODES["interruption"])

    def test_sigterm_is_offered_as_shutdown_with_a_fresh_id(self):
        srv = self.server(join_dir=self.tmp, commit=True)
        a = self.job_agent()
        srv.wait_message("hello")
        a._sigterm.pending = True  # what the handler does
        req = a.poll(4)
        self.assertIsNotNone(req)
        u, idv, _ = sdist.decode(a._sync.sent[-1])
        self.assertEqual((u, sdist.format_id(idv)), (3, req.id))
        self.assertEqual(req.reason, "shutdown")
        self.assertIsNotNone(sdist.parse_id(req.id))
        join = srv.of_type("join")[0]
        self.assertEqual(join["id"], req.id)
        # The real agent refuses a join without a deadline (onJoin): the
        # SIGTERM's is the grace (25 s) less the margin (5 s), as the agent's.
        deadline = parse_time(join.get("deadline"))
        self.assertIsNotNone(deadline, join)
        left = (deadline - datetime.datetime.now(UTC)).total_seconds()
        self.assertTrue(10 < left <= 20, left)
        self.assertEqual(req.deadline, deadline)
        req.done(4)  # waits until committed, then asks the job to stop
        self.assertFalse(a.should_stop)
        self.assertIsNone(a.poll(5))
        self.assertEqual(a._sync.sent[-1][0] >> sdist.ID_BITS, sdist.STOP)
        self.assertTrue(a.should_stop)
        self.assertEqual(a.exit_code, spotagent.EXIT_INTERRUPTED)


def free_port():
    """A free port below the ephemeral range, for rank 0's store. Rank 0
    binds it only after importing torch (20 s and more on a loaded
    machine); a port from the ephemeral range (bind to 0) can meanwhile
    become the source port of any connection, rank 1's own connect
    attempts to it included (a TCP self-connect), and rank 0 then dies
    of EADDRINUSE while rank 1 waits out the rendezvous."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 10000), low)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise AssertionError("no free port in [%d, %d)" % (max(1024, low - 10000), low))


class TestPeerLossClient(Base):
    """What the client does with a lost peer, and with a crash of its own."""

    def setUp(self):
        Base.setUp(self)
        self.exit_file = os.path.join(self.tmp, "exit")
        os.environ["SPOTAGENT_EXIT_FILE"] = self.exit_file
        os.environ["SPOTAGENT_PEER_LOSS_EXIT"] = "0"  # not this test process's sys.excepthook

    def exit_file_says(self):
        with open(self.exit_file) as f:
            return f.read().strip()

    def job_agent(self):
        a = self.connect(rank=0, world_size=2)
        a._sync = FakeSync()
        return a

    def test_agreement_on_a_lost_peer_raises_peer_lost_and_exits_75(self):
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        self.assertIsNone(a.poll(1))
        a._sync.fail = RuntimeError(GLOO_RESET)
        with self.assertRaises(sdist.PeerLost) as cm:
            a.poll(2)
        self.assertIsInstance(cm.exception.__cause__, RuntimeError)
        self.assertEqual(a.exit_code, 75)
        self.assertIn("Connection reset by peer", a.peer_lost)
        self.assertEqual(self.exit_file_says(), "75")
        a.close()
        self.assertEqual(srv.of_type("bye"), [])  # not finished: no bye

    def test_agreement_on_another_error_is_a_crash(self):
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        a._sync.fail = RuntimeError("something else")
        with self.assertRaises(RuntimeError) as cm:
            a.poll(1)
        self.assertNotIsInstance(cm.exception, sdist.PeerLost)
        self.assertEqual(a.exit_code, 0)
        self.assertIsNone(a.peer_lost)
        self.assertFalse(os.path.exists(self.exit_file))

    def test_close_while_a_peer_loss_propagates(self):
        # DDP's own all-reduce failed; the training loop's `finally:` closes.
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        a.poll(1)
        with self.assertRaises(RuntimeError):
            try:
                raise RuntimeError(GLOO_CLOSED)
            finally:
                a.close()
        self.assertEqual(a.exit_code, 75)
        self.assertEqual(self.exit_file_says(), "75")
        self.assertEqual(srv.of_type("bye"), [])

    def test_a_crash_writes_1_first_and_a_later_75_does_not_replace_it(self):
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        a.poll(1)
        with self.assertRaises(ValueError):
            try:
                raise ValueError("a bug")
            finally:
                a.close()
        self.assertEqual(a.exit_code, 0)
        self.assertEqual(self.exit_file_says(), "1")
        self.assertEqual(srv.of_type("bye"), [])
        # Another rank of this node loses this one as a peer afterwards.
        b = self.job_agent()
        b._peer_lost(RuntimeError(GLOO_CLOSED))
        self.assertEqual(b.exit_code, 75)
        self.assertEqual(self.exit_file_says(), "1")

    def test_a_single_trainer_is_unchanged(self):
        srv = self.server()
        a = self.connect()
        srv.wait_message("hello")
        with self.assertRaises(RuntimeError):
            try:
                raise RuntimeError(GLOO_CLOSED)  # not a distributed job: no peers
            finally:
                a.close()
        self.assertEqual(a.exit_code, 0)
        self.assertFalse(os.path.exists(self.exit_file))

    def test_excepthook(self):
        srv = self.server()
        a = self.job_agent()
        srv.wait_message("hello")
        exits = []
        with mock.patch.object(sdist, "_hooked", [a._job.exits]), mock.patch.object(sdist, "_prev_hook", lambda *x: None), \
                mock.patch.object(sdist.os, "_exit", exits.append):
            sdist._excepthook(ValueError, ValueError("a bug"), None)
            self.assertEqual(exits, [])  # a crash: Python's own exit 1
            self.assertEqual(self.exit_file_says(), "1")
            os.remove(self.exit_file)
            e = RuntimeError(GLOO_TIMEOUT)
            sdist._excepthook(RuntimeError, e, None)
            self.assertEqual(exits, [75])
            self.assertEqual(self.exit_file_says(), "75")
            self.assertTrue(a._closed.is_set())


class GlooBase(Base):
    """Real gloo jobs: ranks are processes of TORCH_PYTHON."""

    @classmethod
    def setUpClass(cls):
        r = subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_available()"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode != 0:
            msg = "torch.distributed not importable by %s" % TORCH_PYTHON
            if os.environ.get("SPOTAGENT_ALLOW_NO_TORCH") == "1":
                raise unittest.SkipTest(msg)
            raise AssertionError(msg + " (set SPOTAGENT_ALLOW_NO_TORCH=1 to skip)")

    def setUp(self):
        Base.setUp(self)
        self.procs = []
        self.cond = threading.Condition()

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.reader.join(DEADLINE)
            p.stdout.close()
            p.stderr.close()
        Base.tearDown(self)

    def agent(self, rank, **kw):
        kw.setdefault("welcome", WELCOME)
        kw.setdefault("join_dir", os.path.join(self.tmp, "node%d" % rank))
        s = FakeAgent(os.path.join(self.tmp, "agent%d.sock" % rank), **kw)
        self.servers.append(s)
        return s

    def start(self, ranks):
        """ranks: one dict of env per rank (SOCKET: the fake agent or None)."""
        port = free_port()
        for r, extra in enumerate(ranks):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTAGENT_", "DW_"))}
            env.update(RANK=str(r), WORLD_SIZE=str(len(ranks)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DW_OUT=os.path.join(self.tmp, "out%d.json" % r), OMP_NUM_THREADS="1")
            srv = extra.pop("SOCKET", None)
            if srv is not None:
                env["SPOTAGENT_SOCKET"] = srv.path
            # These tests pin the step of each agreement: every poll agrees.
            # The default (auto k) has its own test below.
            env["SPOTAGENT_SYNC_EVERY"] = "1"
            env.update({k: str(v) for k, v in extra.items()})
            p = subprocess.Popen([TORCH_PYTHON, WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.lines = []
            p.reader = threading.Thread(target=self._read, args=(p,), daemon=True)
            p.reader.start()
            self.procs.append(p)

    def _read(self, p):
        for line in p.stdout:
            with self.cond:
                p.lines.append(line.decode().strip())
                self.cond.notify_all()
        p.wait()
        with self.cond:
            p.ended = True  # every line read
            self.cond.notify_all()

    def wait_line(self, rank, line):
        """The rank printed line (distworker: "waiting N" before poll N),
        within DEADLINE * 3 of its first line (distworker: "joined ..."
        after init_process_group; train_ddp.py: "... fresh" or "resuming")
        and STARTUP of its start: importing torch is most of a rank's start
        (21 s for torch 2.14 at a load average of 14 here)."""
        p = self.procs[rank]

        def failed():  # a rank that ended with an error: the others may wait for it until their timeouts
            return [(r, q) for r, q in enumerate(self.procs) if getattr(q, "ended", False) and q.returncode != 0]

        with self.cond:
            ended = lambda: getattr(p, "ended", False) or failed()  # noqa: E731
            self.cond.wait_for(lambda: p.lines or ended(), STARTUP)
            if p.lines:
                self.cond.wait_for(lambda: line in p.lines or ended(), DEADLINE * 3)
        if line in p.lines:
            return
        for r, q in failed():
            self.fail("rank %d exited %d before rank %d printed %r: %s" % (
                r, q.returncode, rank, line, q.stderr.read().decode()[-3000:]))
        self.fail("rank %d never printed %r (exit code %s; within %d s of its start or %d s of its first line)" % (
            rank, line, p.poll(), STARTUP, DEADLINE * 3))

    def exited(self, rank, timeout=60):
        """rank's exit code and stderr (it must exit within timeout)."""
        p = self.procs[rank]
        err = p.stderr.read()
        p.wait(timeout)
        return p.returncode, err.decode()

    def finish(self):
        outs = []
        for r, p in enumerate(self.procs):
            try:
                err = p.stderr.read()
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            out = os.path.join(self.tmp, "out%d.json" % r)
            self.assertEqual(p.returncode, 0, "rank %d (result written: %s; stdout %r): %s" % (
                r, os.path.exists(out), p.lines[-5:], err.decode()[-3000:]))
            with open(out) as f:
                out = json.load(f)
            out["stderr"] = err.decode()
            self.assertFalse(out["timed_out"], out)
            outs.append(out)
        return outs

    def deadline(self, seconds=60):
        t = datetime.datetime.now(UTC).replace(microsecond=0) + datetime.timedelta(seconds=seconds)
        return t.strftime("%Y-%m-%dT%H:%M:%SZ"), t


class TestGloo(GlooBase):
    """Real 2-rank gloo jobs (tests/distworker.py), one fake agent per rank."""

    def same_request(self, outs, id, reason, deadline):
        evs = [o["events"] for o in outs]
        for e in evs:
            self.assertEqual(len(e), 1, evs)
        self.assertEqual(len({e[0]["step"] for e in evs}), 1, evs)
        for e in evs:
            self.assertEqual((e[0]["id"], e[0]["reason"]), (id, reason))
            self.assertEqual(e[0]["deadline"], deadline.isoformat() if deadline else None)
        return evs[0][0]["step"]

    def test_auto_sync_every_still_saves_at_one_step(self):
        # The default: k agreed from measured times. Both ranks still see the
        # interruption at one and the same step, however late.
        a0, a1 = self.agent(0), self.agent(1)
        self.start([{"SOCKET": a0, "DW_WAIT": "request", "DW_WAIT_AT": 3, "SPOTAGENT_SYNC_EVERY": -1}, {"SOCKET": a1, "SPOTAGENT_SYNC_EVERY": -1}])
        self.wait_line(0, "waiting 3")
        dl, t = self.deadline()
        a0.send({"type": "checkpoint", "id": "a1b2c3d4e5f6", "reason": "interruption",
                 "dir": os.path.join(self.tmp, "node0", "a1b2c3d4e5f6"), "deadline": dl})
        outs = self.finish()
        self.assertGreaterEqual(self.same_request(outs, "a1b2c3d4e5f6", "interruption", t), 3)

    def test_interruption_on_one_node_is_saved_by_both_at_one_step(self):
        a0, a1 = self.agent(0), self.agent(1)
        self.start([{"SOCKET": a0, "DW_WAIT": "request", "DW_WAIT_AT": 3}, {"SOCKET": a1}])
        self.wait_line(0, "waiting 3")
        dl, t = self.deadline()
        a0.send({"type": "checkpoint", "id": "a1b2c3d4e5f6", "reason": "interruption",
                  "dir": os.path.join(self.tmp, "node0", "a1b2c3d4e5f6"), "deadline": dl})
        outs = self.finish()
        step = self.same_request(outs, "a1b2c3d4e5f6", "interruption", t)
        self.assertEqual(step, 3)
        self.assertEqual(outs[1]["events"][0]["dir"], os.path.join(self.tmp, "node1", "a1b2c3d4e5f6"))
        self.assertEqual(a1.of_type("join"), [{"type": "join", "id": "a1b2c3d4e5f6", "reason": "interruption",
                                               "deadline": dl.replace("Z", ".000Z"), "step": step}])
        self.assertEqual(a0.of_type("join"), [])
        for a in (a0, a1):
            done = a.wait_message("done")
            self.assertEqual([(m["id"], m["step"]) for m in done], [("a1b2c3d4e5f6", step)])
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "node1", "a1b2c3d4e5f6", "rank-1.txt")))

    def test_ranks_resumed_from_different_steps_fail_at_the_first_poll(self):
        # A node that fell back to an older checkpoint (another part was
        # damaged) must not train on: every rank raises at the first poll.
        a0 = self.agent(0, welcome=dict(WELCOME, resume={"dir": self.tmp, "step": 20, "id": "a", "manifest": ""}))
        a1 = self.agent(1, welcome=dict(WELCOME, resume={"dir": self.tmp, "step": 10, "id": "b", "manifest": ""}))
        self.start([{"SOCKET": a0}, {"SOCKET": a1}])
        for r, p in enumerate(self.procs):
            try:
                err = p.stderr.read().decode()
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.fail("rank %d did not end" % r)
            self.assertNotEqual(p.returncode, 0, "rank %d" % r)
            self.assertIn("resumed from different checkpoints (steps 10 to 20", err, "rank %d" % r)

    def test_interruption_beats_a_periodic_request_elsewhere(self):
        a0, a1 = self.agent(0), self.agent(1)
        self.start([{"SOCKET": a0, "DW_WAIT": "request"}, {"SOCKET": a1, "DW_WAIT": "request"}])
        self.wait_line(0, "waiting 1")
        self.wait_line(1, "waiting 1")
        dl, t = self.deadline()
        a0.send({"type": "checkpoint", "id": "000000000001", "reason": "interruption", "dir": self.tmp,
                 "deadline": dl})
        a1.send({"type": "checkpoint", "id": "ffffffffffff", "reason": "periodic", "dir": self.tmp})
        outs = self.finish()
        self.same_request(outs, "000000000001", "interruption", t)
        self.assertEqual([m["id"] for m in a1.of_type("join")], ["000000000001"])
        for a in (a0, a1):
            self.assertEqual([m["id"] for m in a.of_type("done") + a.of_type("failed")], ["000000000001"])

    def test_no_agent_on_one_rank_does_not_deadlock(self):
        a0 = self.agent(0)
        self.start([{"SOCKET": a0, "DW_WAIT": "request"}, {}])
        self.wait_line(0, "waiting 1")
        a0.send({"type": "checkpoint", "id": "00000000beef", "reason": "interruption", "dir": self.tmp})
        outs = self.finish()
        self.assertEqual([e["id"] for e in outs[0]["events"]], ["00000000beef"])
        self.assertEqual(outs[1]["events"], [])
        self.assertIn("takes no part in the job's checkpoint 00000000beef", outs[1]["stderr"])
        self.assertTrue(outs[0]["active"] and outs[1]["active"])

    def test_stop_on_one_node_stops_every_rank_at_one_step(self):
        a0, a1 = self.agent(0), self.agent(1)
        self.start([{"SOCKET": a0}, {"SOCKET": a1, "DW_WAIT": "stop", "DW_WAIT_AT": 4}])
        self.wait_line(1, "waiting 4")
        a1.send({"type": "stop", "reason": "interruption"})
        outs = self.finish()
        self.assertEqual([o["stop_step"] for o in outs], [4, 4])
        self.assertEqual([o["exit_code"] for o in outs], [75, 75])
        self.assertEqual([o["stop_reason"] for o in outs], ["interruption", "interruption"])

    def test_sigterm_on_one_rank_checkpoints_then_stops_the_job(self):
        a0, a1 = self.agent(0, commit=True), self.agent(1, commit=True)
        self.start([{"SOCKET": a0, "DW_AFTER": 50},
                    {"SOCKET": a1, "DW_AFTER": 50, "DW_SIGTERM_AT": 2, "SPOTAGENT_HANDLE_SIGTERM": 1}])
        outs = self.finish()
        ev = outs[1]["events"][0]
        self.assertIsNotNone(ev["deadline"], ev)  # the real agent's join requires one
        self.same_request(outs, ev["id"], "shutdown", datetime.datetime.fromisoformat(ev["deadline"]))
        rid = outs[0]["events"][0]["id"]
        self.assertEqual(outs[0]["events"][0]["step"], 3)
        for a in (a0, a1):
            self.assertEqual([m["id"] for m in a.of_type("join")], [rid])
        self.assertEqual([o["stop_step"] for o in outs], [4, 4])
        self.assertEqual([o["exit_code"] for o in outs], [75, 75])

    def test_sync_every_and_connect_before_init_process_group(self):
        a0, a1 = self.agent(0), self.agent(1)
        common = {"SPOTAGENT_SYNC_EVERY": 4, "DW_CONNECT_FIRST": 1}
        self.start([dict(common, SOCKET=a0, DW_WAIT="request", DW_WAIT_AT=2), dict(common, SOCKET=a1)])
        self.wait_line(0, "waiting 2")
        dl, t = self.deadline()  # the real agent's requests always carry one
        a0.send({"type": "checkpoint", "id": "0000000000aa", "reason": "manual", "dir": self.tmp, "deadline": dl})
        outs = self.finish()
        self.assertEqual(self.same_request(outs, "0000000000aa", "manual", t), 5)  # syncs at calls 1, 5, 9...
        self.assertEqual([o["events"][0]["call"] for o in outs], [5, 5])

    def test_world_size_one_is_the_single_trainer_behaviour(self):
        a0 = self.agent(0)
        self.start([{"SOCKET": a0, "DW_WAIT": "request", "SPOTAGENT_SYNC_EVERY": 5}])
        self.wait_line(0, "waiting 1")
        a0.send({"type": "checkpoint", "id": "not-hex-id", "reason": "periodic", "dir": self.tmp})
        outs = self.finish()
        self.assertFalse(outs[0]["active"])
        self.assertEqual([(e["id"], e["step"]) for e in outs[0]["events"]], [("not-hex-id", 1)])


class TestGlooPeerLoss(GlooBase):
    """Real 2-rank gloo jobs whose rank 1 vanishes: rank 0 exits 75 at
    once (its sockets reset) or after the process group's timeout (a
    partitioned peer: nothing resets), with 75 in its exit file; a rank
    that crashes on a bug of its own exits 1, with 1 in its exit file."""

    def run(self, result=None):
        # SPOTAGENT_PEER_LOSS_EXIT from an outer environment must not turn
        # the hook off in the ranks.
        os.environ.pop("SPOTAGENT_PEER_LOSS_EXIT", None)
        return GlooBase.run(self, result)

    def job(self, vanish, how="kill", pg_timeout=20):
        a0, a1 = self.agent(0), self.agent(1)
        files = [os.path.join(self.tmp, "exit%d" % r) for r in (0, 1)]
        self.start([{"SOCKET": a0, "SPOTAGENT_EXIT_FILE": files[0], "DW_PG_TIMEOUT": pg_timeout},
                    {"SOCKET": a1, "SPOTAGENT_EXIT_FILE": files[1], "DW_VANISH_AT": vanish, "DW_VANISH": how,
                     "DW_PG_TIMEOUT": pg_timeout}])
        self.wait_line(1, "vanishing (%s) at step %s" % (how, vanish.split(":")[0]))
        t0 = time.monotonic()
        code, err = self.exited(0)
        return code, err, time.monotonic() - t0, files

    def said(self, path):
        with open(path) as f:
            return f.read().strip()

    def test_peer_killed_in_the_agreement(self):
        code, err, took, files = self.job("5:poll")
        self.assertEqual(code, 75, err[-3000:])
        self.assertIn("PeerLost", err)
        self.assertEqual(self.said(files[0]), "75")
        self.assertLess(took, 15)

    def test_peer_killed_in_the_training_collective(self):
        code, err, took, files = self.job("5:collective")
        self.assertEqual(code, 75, err[-3000:])
        self.assertIn("a peer of this job is gone", err)
        self.assertEqual(self.said(files[0]), "75")
        self.assertLess(took, 15)

    def test_partitioned_peer_after_the_group_timeout(self):
        code, err, took, files = self.job("5:collective", how="stop", pg_timeout=3)
        self.procs[1].kill()
        self.assertEqual(code, 75, err[-3000:])
        self.assertIn("Timed out waiting", err)
        self.assertEqual(self.said(files[0]), "75")
        self.assertGreaterEqual(took, 2.0)  # the group's timeout (3 s from the last collective's start)
        self.assertLess(took, 20)

    def test_a_crash_of_its_own_exits_1(self):
        code, err, _, files = self.job("5:collective", how="raise")
        self.assertEqual(code, 75, err[-3000:])  # rank 0 lost rank 1 as a peer
        code1, err1 = self.exited(1)
        self.assertEqual(code1, 1, err1[-3000:])
        self.assertIn("ValueError: a bug of this rank's own", err1)
        self.assertEqual(self.said(files[1]), "1")


class TestTrainDDP(GlooBase):
    """examples/train_ddp.py: 2 ranks interrupted (a notice on one node),
    then resumed, end bit-identical to an uninterrupted run."""

    script = os.path.join(HERE, "..", "examples", "train_ddp.py")

    def run_ranks(self, ranks, steps):
        port = free_port()
        for r, extra in enumerate(ranks):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTAGENT_", "DW_"))}
            env.update(RANK=str(r), WORLD_SIZE=str(len(ranks)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       GROUP_RANK=str(r), LOCAL_RANK="0", TOTAL_STEPS=str(steps), STEP_SLEEP_MS="2",
                       OMP_NUM_THREADS="1")
            env.update({k: str(v) for k, v in extra.items()})
            p = subprocess.Popen([TORCH_PYTHON, self.script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.lines = []
            p.reader = threading.Thread(target=self._read, args=(p,), daemon=True)
            p.reader.start()
            self.procs.append(p)
        return self.procs[-len(ranks):]

    def results(self, procs):
        out = []
        for r, p in enumerate(procs):
            try:
                err = p.stderr.read()
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.reader.join(DEADLINE)
            final = [l.split(" ", 2)[2] for l in p.lines if l.startswith("rank %d final " % r)]
            self.assertEqual(len(final), 1, "rank %d: %s" % (r, err.decode()[-3000:]))
            out.append((p.returncode, final[0], p.lines))
        return out

    def test_interrupted_and_resumed_is_bit_identical(self):
        steps = 300
        full = self.results(self.run_ranks([{}, {}], steps))
        self.assertEqual([c for c, _, _ in full], [0, 0])
        self.assertEqual(full[0][1], full[1][1])  # DDP keeps the replicas equal
        self.assertTrue(full[0][1].endswith(" step=%d" % steps), full[0][1])

        welcome = {"type": "welcome", "version": 1}
        a0, a1 = self.agent(0, welcome=welcome), self.agent(1, welcome=welcome)
        # Slow steps (sleeps only; not part of the result) keep the ranks training until the
        # stop arrives: at 2 ms a fast machine finished all 300 steps first and exited 0.
        slow = {"STEP_SLEEP_MS": "200"}
        procs = self.run_ranks([dict(slow, SPOTAGENT_SOCKET=a0.path), dict(slow, SPOTAGENT_SOCKET=a1.path)], steps)
        self.wait_line(len(self.procs) - 2, "rank 0 step 10")
        rid = "0123456789ab"
        dl, _ = self.deadline()
        a0.send({"type": "checkpoint", "id": rid, "reason": "interruption",
                 "dir": os.path.join(self.tmp, "node0", rid), "deadline": dl})
        done = [a.wait_message("done")[0] for a in (a0, a1)]
        self.assertEqual(done[0]["step"], done[1]["step"])
        self.assertEqual([m["id"] for m in a1.of_type("join")], [rid])
        a0.send({"type": "stop", "reason": "interruption"})
        part = self.results(procs)
        self.assertEqual([c for c, _, _ in part], [75, 75])
        self.assertEqual(part[0][1].split()[-1], part[1][1].split()[-1])  # stopped at one step
        saved = done[0]["step"]
        self.assertLess(saved, steps)

        # A fresh job resumes from the two parts put together.
        resume = os.path.join(self.tmp, "resume")
        os.makedirs(resume)
        for r in (0, 1):
            os.rename(os.path.join(self.tmp, "node%d" % r, rid, "rank-%d.pt" % r),
                      os.path.join(resume, "rank-%d.pt" % r))
        again = self.results(self.run_ranks([{"SPOTAGENT_RESUME_DIR": resume}] * 2, steps))
        self.assertEqual([c for c, _, _ in again], [0, 0])
        for r, (_, _, lines) in enumerate(again):
            self.assertIn("rank %d resuming from step %d" % (r, saved), lines)
        self.assertEqual([f for _, f, _ in again], [full[0][1], full[1][1]])


if __name__ == "__main__":
    unittest.main()


class TestAutoSyncEvery(unittest.TestCase):
    """sync_every's default (auto): k from the measured step and collective
    times, bounded by the overhead and by the latency of a request."""

    def k(self, step, coll):
        s = sdist.Sync(every=sdist.AUTO)
        s.step_s, s.coll_s = step, coll
        return s.propose()

    def test_cheap_collective_agrees_every_step(self):
        self.assertEqual(self.k(step=1.0, coll=0.001), 1)

    def test_costly_collective_spaces_agreements(self):
        # 1 ms collective, 10 ms steps: every 20 steps is 0.5 %.
        self.assertEqual(self.k(step=0.010, coll=0.001), 20)

    def test_latency_bound_wins(self):
        # 1,000 ranks: a 20 ms collective on 5 ms steps would want k = 800,
        # but a notice must reach every rank within 1 s: k = 200.
        self.assertEqual(self.k(step=0.005, coll=0.020), 200)

    def test_unknown_times_agree_every_step(self):
        self.assertEqual(self.k(step=None, coll=None), 1)

    def test_fixed_sync_every_is_kept(self):
        s = sdist.Sync(every=7)
        s.step_s, s.coll_s = 0.001, 1.0
        self.assertEqual(s.propose(), 7)
        self.assertEqual([s.due() for _ in range(8)], [True] + [False] * 6 + [True])
