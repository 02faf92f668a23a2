"""spotagent.torch.save and the client's background writes (issue 16), with
real PyTorch when it is installed (Debian python3-torch)."""

import os
import pickle
import subprocess
import sys
import threading
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import spotagent  # noqa: E402
import spotagent.torch as satorch  # noqa: E402
from fakeagent import DEADLINE  # noqa: E402
from test_client import Base, wait_agent  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

needs_torch = unittest.skipIf(torch is None, "PyTorch is not installed")


class Gate(object):
    """Holds background writers until released: a test decides when a
    file is written, instead of racing the writer thread."""

    def __init__(self):
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def wrap(self, fn):
        def wrapped(*a, **kw):
            self.entered.release()
            if not self.release.wait(DEADLINE):
                raise RuntimeError("gate never released")
            return fn(*a, **kw)

        return wrapped

    def wait_entered(self, n=1):
        for _ in range(n):
            if not self.entered.acquire(timeout=DEADLINE):
                raise AssertionError("writer never started")


class TorchBase(Base):
    def request(self, srv, a, id, step):
        d = os.path.join(self.tmp, id)
        srv.send({"type": "checkpoint", "id": id, "reason": "periodic", "dir": d})
        self.pending(a)
        req = a.poll(step)
        self.assertIsNotNone(req)
        return req

    def setUp(self):
        Base.setUp(self)
        satorch.forget_buffers()


@needs_torch
class TestStaging(TorchBase):
    def test_stage_copies_cpu_tensors(self):
        t = torch.arange(6, dtype=torch.float32)
        sd = {"w": t, "tied": t, "nested": [{"b": torch.ones(2)}], "n": 3}
        st = satorch.stage(sd)
        self.assertIsNot(st["w"], t)
        self.assertNotEqual(st["w"].data_ptr(), t.data_ptr())
        self.assertIs(st["w"], st["tied"])  # sharing kept
        t.add_(100)  # an optimizer step, in place
        sd["nested"][0]["b"].mul_(7)
        self.assertTrue(torch.equal(st["w"], torch.arange(6, dtype=torch.float32)))
        self.assertTrue(torch.equal(st["nested"][0]["b"], torch.ones(2)))

    def test_reused_and_parallel_staging_bit_identical(self):
        """Large tensors are copied in chunks by several threads, into the
        buffers of the previous checkpoint when shapes match: the copy is
        bit-identical every time, the buffers are the same objects (no new
        allocation), and a changed shape gets a new buffer."""
        n = (satorch._CHUNK // 4) * 4 + 3  # 4 chunks' worth, odd tail
        big = torch.randn(n)
        perm = torch.randn(64, 32).t()  # dense, not contiguous
        state = {"big": big, "perm": perm, "half": torch.randn(100).half(), "step": torch.tensor(7)}
        reuse = {}
        with mock.patch.object(satorch, "_workers", lambda: 4):
            first = satorch.stage(state, reuse)
            ptrs = {k: v.data_ptr() for k, v in first.items()}
            for i in range(2):
                for v in state.values():
                    v.add_(1)  # a training step, in place
                st = satorch.stage(state, reuse)
                for k, v in state.items():
                    self.assertTrue(torch.equal(st[k], v), k)
                    self.assertEqual(st[k].dtype, v.dtype)
                    self.assertNotEqual(st[k].data_ptr(), v.data_ptr(), k)
                    self.assertEqual(st[k].data_ptr(), ptrs[k], "%s: buffer not reused" % k)
                self.assertEqual(st["perm"].stride(), perm.stride())
            state["big"] = torch.randn(n + 1)
            st = satorch.stage(state, reuse)
            self.assertNotEqual(st["big"].data_ptr(), ptrs["big"])
            self.assertTrue(torch.equal(st["big"], state["big"]))
        self.assertEqual(sorted(k[0] for k in reuse), sorted(state))  # one buffer per tensor, no more

    def test_state_dict_metadata_kept(self):
        m = torch.nn.Linear(3, 2)
        st = satorch.stage(m.state_dict())
        self.assertEqual(getattr(st, "_metadata", None), m.state_dict()._metadata)
        torch.nn.Linear(3, 2).load_state_dict(st)

    def test_inplace_update_after_save_never_reaches_the_file(self):
        """The crucial property: save returns, the optimizer updates the
        parameters in place while the file is still being written, and the
        file holds the values at save time -- also when the staging buffers
        of an earlier checkpoint are reused."""
        srv = self.server()
        a = self.connect()
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        for i, rid in enumerate(["r1", "r2"]):
            req = self.request(srv, a, rid, 10 + i)
            want = {k: v.clone() for k, v in model.state_dict().items()}
            gate = Gate()
            with mock.patch.object(torch, "save", gate.wrap(torch.save)):
                satorch.save(req, model.state_dict(), "model.pt")
                req.done(10 + i)
                gate.wait_entered()
                # Training goes on before the file is written.
                model(torch.randn(8, 64)).sum().backward()
                opt.step()
                with torch.no_grad():
                    model.weight.add_(1.0)
                gate.release.set()
                self.assertTrue(req.wait(DEADLINE))
            got = torch.load(os.path.join(req.dir, "model.pt"))
            for k in want:
                self.assertTrue(torch.equal(got[k], want[k]), "%s of %s changed after save" % (k, rid))
                self.assertFalse(torch.equal(got[k], model.state_dict()[k]))


@needs_torch
class TestBackgroundSave(TorchBase):
    def test_saved_then_done_with_blocked_ms(self):
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "000000000012-a", 12)
        satorch.save(req, {"w": torch.ones(1000)}, "model.pt")
        satorch.save(req, {"m": torch.zeros(10)}, "sub/optim.pt")
        with self.assertRaises(ValueError):
            satorch.save(req, {}, "model.pt")  # twice in one request
        req.done(12, metadata={"epoch": 1})
        done = srv.wait_message("done")[0]
        saved = srv.of_type("saved")
        self.assertEqual(sorted(m["path"] for m in saved), ["model.pt", os.path.join("sub", "optim.pt")])
        self.assertTrue(all(m["id"] == req.id and m["step"] == 12 for m in saved))
        # Every saved precedes done.
        with srv.cond:
            types = [m["type"] for m in srv.received if m["type"] in ("saved", "done")]
        self.assertEqual(types, ["saved", "saved", "done"])
        self.assertEqual((done["id"], done["step"], done["metadata"]), (req.id, 12, {"epoch": 1}))
        self.assertIsInstance(done["blocked_ms"], int)
        self.assertGreaterEqual(done["blocked_ms"], 0)
        self.assertTrue(torch.equal(torch.load(os.path.join(req.dir, "model.pt"))["w"], torch.ones(1000)))

    def test_done_does_not_start_writers_on_the_callers_thread(self):
        """done() returns without starting the writer threads itself: a
        Thread.start() waits for the new thread to take the GIL, which a
        running writer (torch.save's CRC32 of a whole tensor) holds for up
        to ~0.3 s per GiB -- time the bench saw as training blocked."""
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "starts", 4)
        starters = []
        real_start = threading.Thread.start

        def start(th):
            if th.name.startswith("spotagent-write"):
                starters.append(threading.current_thread().name)
            return real_start(th)

        with mock.patch.object(threading.Thread, "start", start):
            for name in ("a.pt", "b.pt", "c.pt"):
                satorch.save(req, {"w": torch.ones(4)}, name)
            req.done(4)
            self.assertTrue(req.wait(DEADLINE))
        self.assertEqual(len(starters), 3)
        self.assertNotIn(threading.current_thread().name, starters)
        self.assertEqual(srv.wait_message("done")[0]["id"], "starts")

    def test_buffers_of_one_request_only_when_names_change(self):
        """One staged copy kept, not one per file name: a trainer naming its
        files by step reuses the last request's buffer (same position) and
        never accumulates them."""
        import gc

        srv = self.server()
        a = self.connect()
        w = torch.randn(12347)  # a size no other tensor here has
        ptrs = []
        for i in range(3):
            req = self.request(srv, a, "step%d" % i, i)
            with mock.patch.object(torch, "save", lambda obj, f: ptrs.append(obj["w"].data_ptr()) or f.write(b"x")):
                satorch.save(req, {"w": w}, "model-%d.pt" % i)
                req.done(i)
                self.assertTrue(req.wait(DEADLINE))
            w.add_(1)
        gc.collect()
        copies = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o is not w and o.numel() == 12347]
        self.assertEqual(len(copies), 1, "staged copies kept after 3 requests with new names")
        self.assertEqual(len(set(ptrs)), 1, "the buffer was not reused across names")

    def test_writers_start_once_staging_is_over(self):
        """Writers start at done() or the next poll(), not while the caller
        may still be staging the next file (their CPU would slow it)."""
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "lazy", 3)
        satorch.save(req, {"w": torch.ones(4)}, "a.pt")
        satorch.save(req, {"w": torch.ones(4)}, "b.pt")
        self.assertFalse(os.path.exists(os.path.join(req.dir, "a.pt")))
        self.assertTrue(req.writing)
        a.poll(3)  # the training loop's next step starts them
        self.assertTrue(req.wait(DEADLINE))
        self.assertTrue(os.path.exists(os.path.join(req.dir, "b.pt")))
        self.assertEqual(len(srv.wait_message("saved", 2)), 2)
        req.done(3)
        self.assertEqual(srv.wait_message("done")[0]["id"], "lazy")

    def test_files_written_one_at_a_time_and_saved_before_fsync(self):
        """A request's files are written one at a time, in the order they
        were submitted, and each is reported saved once written, before its
        fsync: the agent uploads the first while the next is written, and
        the fsyncs hold up neither (issue 30 item 8)."""
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "order", 1)
        order, overlapped, writing = [], [], []
        lock = threading.Lock()

        def record(obj, f):
            with lock:
                writing.append(1)
                overlapped.append(len(writing) > 1)
                order.extend(obj.keys())
            f.write(b"x")
            with lock:
                writing.pop()

        release = threading.Event()
        real_fsync = os.fsync

        def held_fsync(fd):
            if not release.wait(DEADLINE):
                raise RuntimeError("fsync never released")
            real_fsync(fd)

        with mock.patch.object(torch, "save", record), mock.patch.object(os, "fsync", held_fsync):
            for n in "abcd":
                satorch.save(req, {n: torch.ones(1)}, n + ".pt")
            req.done(1)
            # Every file is reported while every fsync is still held.
            saved = srv.wait_message("saved", 4)
            self.assertEqual(srv.of_type("done"), [])
            release.set()
            self.assertTrue(req.wait(DEADLINE))
        self.assertEqual([m["path"] for m in saved], ["a.pt", "b.pt", "c.pt", "d.pt"])
        self.assertEqual(order, list("abcd"))
        self.assertEqual(overlapped, [False] * 4)
        self.assertEqual(srv.wait_message("done")[0]["id"], "order")
        self.assertEqual(srv.of_type("failed"), [])

    def test_a_failed_write_passes_the_turn_on(self):
        """A file that cannot be written fails the checkpoint at done, and
        the files after it are still written (the turn is not lost)."""
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "turn", 2)
        calls = []

        def first_fails(obj, f):
            (n,) = obj.keys()
            calls.append(n)
            if n == "a":
                raise OSError("disk full")
            f.write(b"x")

        with mock.patch.object(torch, "save", first_fails):
            for n in "abc":
                satorch.save(req, {n: torch.ones(1)}, n + ".pt")
            req.done(2)
            self.assertTrue(req.wait(DEADLINE))
        self.assertEqual(calls, ["a", "b", "c"])
        self.assertIn("disk full", srv.wait_message("failed")[0]["error"])
        self.assertEqual(sorted(m["path"] for m in srv.of_type("saved")), ["b.pt", "c.pt"])

    def test_next_request_waits_for_the_previous_writes(self):
        """At most one staged copy: a new request's save blocks while the
        previous request's files are still being written."""
        srv = self.server()
        a = self.connect()
        r1 = self.request(srv, a, "one", 1)
        gate = Gate()
        with mock.patch.object(torch, "save", gate.wrap(torch.save)):
            satorch.save(r1, {"w": torch.ones(10)}, "model.pt")
            r1.done(1)
            gate.wait_entered()
            r2 = self.request(srv, a, "two", 2)
            returned = threading.Event()

            def second():
                satorch.save(r2, {"w": torch.ones(10) * 2}, "model.pt")
                returned.set()

            t = threading.Thread(target=second)
            t.start()
            self.assertFalse(returned.wait(0.3), "second save returned while the first was still writing")
            gate.release.set()
            self.assertTrue(returned.wait(DEADLINE))
            t.join(DEADLINE)
            r2.done(2)
            self.assertTrue(r2.wait(DEADLINE))
        self.assertGreater(r2.blocked, 0)
        self.assertEqual([m["id"] for m in srv.wait_message("done", 2)], ["one", "two"])

    def test_write_failure_sends_failed(self):
        srv = self.server()
        a = self.connect()
        req = self.request(srv, a, "bad", 1)

        def boom(obj, f):
            raise OSError(28, "No space left on device")

        with mock.patch.object(torch, "save", boom):
            satorch.save(req, {"w": torch.ones(1)}, "model.pt")
            req.done(1)
            self.assertTrue(req.wait(DEADLINE))
        f = srv.wait_message("failed")[0]
        self.assertIn("No space left", f["error"])
        self.assertEqual(srv.of_type("done"), [])

    def test_interruption_then_close_waits_for_the_write(self):
        """An interruption uses the same call and then stops: close() waits
        until the file is written and done sent."""
        srv = self.server()
        a = self.connect()
        d = os.path.join(self.tmp, "int")
        srv.send({"type": "checkpoint", "id": "int", "reason": "interruption", "dir": d,
                  "deadline": "2099-01-01T00:00:00Z"})
        self.pending(a)
        req = a.poll(5)
        gate = Gate()
        with mock.patch.object(torch, "save", gate.wrap(torch.save)):
            satorch.save(req, {"w": torch.ones(3)}, "model.pt")
            req.done(5)
            gate.wait_entered()
            closer = threading.Thread(target=a.close)
            closer.start()
            gate.release.set()
            closer.join(DEADLINE)
        self.assertFalse(closer.is_alive())
        self.assertEqual(srv.wait_message("done")[0]["id"], "int")


class TestWithoutTorch(unittest.TestCase):
    def test_no_hard_dependency(self):
        """Without torch (blocked from importing), save pickles the staged
        copy; plain objects are deep-copied at save time."""
        code = r"""
import os, pickle, sys, tempfile
sys.modules["torch"] = None  # import torch fails
sys.path.insert(0, %r)
import spotagent, spotagent.torch
from spotagent.client import CheckpointRequest
a = spotagent.connect(path="")
d = tempfile.mkdtemp()
req = CheckpointRequest(a, 0, id="", dir=d, reason="manual", deadline=None)
state = {"w": [1, 2, 3], "obj": bytearray(b"ab")}
spotagent.torch.save(req, state, "state.pkl")
state["w"].append(4); state["obj"][0] = 0
assert req._join_writes(10)
with open(os.path.join(d, "state.pkl"), "rb") as f:
    got = pickle.load(f)
assert got == {"w": [1, 2, 3], "obj": bytearray(b"ab")}, got
print("ok")
""" % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "ok")


if __name__ == "__main__":
    unittest.main()
