"""The framework integrations (spotagent.hf, spotagent.lightning,
spotagent.dcp) against a real client on a real socket (tests/fakeagent.py).

The Trainer's and Lightning's side of each hook are stand-ins here (plain
objects with the fields the hooks read and write): the real Hugging Face
Trainer runs the callback end to end under torch 2.x in
integration/torch2_test.go (the real agent, a notice, a resume). Lightning
is not installable on this machine (Debian ships no package): its callback's
logic is tested here only, on the stand-in, and on the GPU machine by
scripts/device-check.sh when Lightning is there. The DCP tests need torch
2.x (`dcp.save`, DTensor): they run when this suite runs under
scripts/sid-python (`make test-python` runs it under both torches)."""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spotagent  # noqa: E402
import spotagent.dcp  # noqa: E402
import spotagent.hf  # noqa: E402
import spotagent.lightning  # noqa: E402
from fakeagent import DEADLINE, FakeAgent  # noqa: E402

WELCOME = {"type": "welcome", "run_id": "r", "checkpoint_dir": "/tmp", "resume": None}


def wait_until(pred, timeout=DEADLINE):
    ev = threading.Event()
    deadline = __import__("time").monotonic() + timeout
    while not pred():
        if __import__("time").monotonic() > deadline:
            return False
        ev.wait(0.01)
    return True


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spf-")
        self.sock = os.path.join(self.tmp, "a.sock")
        self.env = mock.patch.dict(os.environ, {})
        self.env.start()
        for k in list(os.environ):
            if k.startswith("SPOTAGENT_"):
                os.environ.pop(k)
        self.srv = FakeAgent(self.sock, welcome=WELCOME)
        self.agent = spotagent.connect(path=self.sock)
        logging.getLogger("spotagent").setLevel(logging.ERROR)

    def tearDown(self):
        self.agent.close(timeout=1.0)
        self.srv.stop()
        self.env.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def request(self, id="000000000010-a", reason="interruption"):
        d = os.path.join(self.tmp, "req-" + id)
        self.srv.send({"type": "checkpoint", "id": id, "reason": reason, "dir": d})
        self.assertTrue(wait_until(lambda: len(self.agent._requests) >= 1), "request never arrived")
        return d

    def stop(self):
        self.srv.send({"type": "stop", "reason": "interruption"})
        self.assertTrue(wait_until(lambda: self.agent._should_stop), "stop never arrived")


def hf_objects(output_dir, step):
    args = types.SimpleNamespace(output_dir=output_dir)
    state = types.SimpleNamespace(global_step=step, epoch=0.5)
    control = types.SimpleNamespace(should_save=False, should_training_stop=False)
    return args, state, control


def trainer_save(output_dir, step, sentinel=False):
    """What Trainer._save_checkpoint leaves: checkpoint-<step>/ with
    trainer_state.json written last."""
    d = os.path.join(output_dir, "checkpoint-%d" % step)
    os.makedirs(os.path.join(d, "sub"))
    for name, data in (("model.safetensors", b"w" * 100), ("optimizer.pt", b"o" * 50), ("sub/x", b"x"),
                       ("trainer_state.json", b'{"global_step": %d}' % step)):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    if sentinel:
        open(os.path.join(d, spotagent.hf.INCOMPLETE_SENTINEL), "w").close()
    return d


class TestHF(Base):
    def test_request_becomes_trainer_save_then_stop_and_exit_code(self):
        out = os.path.join(self.tmp, "out")
        cb = spotagent.hf.Logic(self.agent)
        args, state, control = hf_objects(out, 9)
        cb.on_step_end(args, state, control)
        self.assertFalse(control.should_save, "no request: no save")
        reqdir = self.request()
        state.global_step = 10
        cb.on_step_end(args, state, control)
        self.assertTrue(control.should_save, "a request must make the Trainer save at this step end")
        self.assertFalse(control.should_training_stop)
        ck = trainer_save(out, 10)
        control.should_save = False
        cb.on_save(args, state, control)
        done = self.srv.wait_message("done")[0]
        self.assertEqual(done["step"], 10)
        self.assertEqual(done["metadata"], {"global_step": 10, "epoch": 0.5, "checkpoint": "checkpoint-10",
                                            "framework": "transformers"})
        for rel in ("model.safetensors", "optimizer.pt", "sub/x", "trainer_state.json"):
            a, b = os.stat(os.path.join(ck, rel)), os.stat(os.path.join(reqdir, rel))
            self.assertEqual((a.st_ino, a.st_dev), (b.st_ino, b.st_dev), "%s is not a hard link" % rel)
        # The Trainer rotates the checkpoint away: the request's copy stays.
        shutil.rmtree(ck)
        self.assertTrue(os.path.isfile(os.path.join(reqdir, "model.safetensors")))
        self.stop()
        state.global_step = 11
        cb.on_step_end(args, state, control)
        self.assertTrue(control.should_training_stop)
        with self.assertRaises(SystemExit) as e:
            cb.on_train_end(args, state, control)
        self.assertEqual(e.exception.code, spotagent.EXIT_INTERRUPTED)

    def test_save_without_trainer_state_fails_the_request(self):
        out = os.path.join(self.tmp, "out")
        cb = spotagent.hf.Logic(self.agent)
        args, state, control = hf_objects(out, 5)
        self.request("000000000005-b", "periodic")
        cb.on_step_end(args, state, control)
        os.makedirs(os.path.join(out, "checkpoint-5"))
        cb.on_save(args, state, control)
        failed = self.srv.wait_message("failed")[0]
        self.assertIn("trainer_state.json", failed["error"])
        self.assertEqual(cb.saved, [])

    def test_own_saves_are_not_reported(self):
        out = os.path.join(self.tmp, "out")
        cb = spotagent.hf.Logic(self.agent)
        args, state, control = hf_objects(out, 20)
        trainer_save(out, 20)
        cb.on_save(args, state, control)  # a save_steps save: nobody asked
        self.assertFalse(self.srv.wait_for(lambda: self.srv.of_type("done"), timeout=0.3))

    def test_training_ends_before_the_save(self):
        cb = spotagent.hf.Logic(self.agent, exit_on_stop=False)
        args, state, control = hf_objects(os.path.join(self.tmp, "out"), 3)
        self.request("000000000003-c", "periodic")
        cb.on_step_end(args, state, control)
        cb.on_train_end(args, state, control)
        self.assertIn("training ended", self.srv.wait_message("failed")[0]["error"])

    def test_sigterm_handler_only_with_an_agent(self):
        cb = spotagent.hf.Logic(self.agent)
        with mock.patch.object(self.agent, "handle_sigterm") as h:
            cb.on_train_begin(*hf_objects(self.tmp, 0))
        h.assert_called_once_with()
        noagent = spotagent.connect(path=None)
        cb = spotagent.hf.Logic(noagent)
        with mock.patch.object(noagent, "handle_sigterm") as h:
            cb.on_train_begin(*hf_objects(self.tmp, 0))
        h.assert_not_called()

    def test_resume_from_checkpoint(self):
        class A(object):
            resume_dir = None

        a = A()
        self.assertIsNone(spotagent.hf.resume_from_checkpoint(a))
        a.resume_dir = trainer_save(self.tmp, 30)
        self.assertEqual(spotagent.hf.resume_from_checkpoint(a), a.resume_dir)
        a.resume_dir = trainer_save(os.path.join(self.tmp, "x"), 40, sentinel=True)
        self.assertIsNone(spotagent.hf.resume_from_checkpoint(a), "a checkpoint with the incomplete sentinel")

    def test_link_tree_leaves_the_sentinel_out(self):
        src = trainer_save(self.tmp, 7, sentinel=True)
        got = spotagent.hf.link_tree(src, os.path.join(self.tmp, "dst"))
        self.assertEqual(sorted(got), ["model.safetensors", "optimizer.pt", "sub/x", "trainer_state.json"])


class StandInLightningTrainer(object):
    """The fields and the method of lightning.Trainer the callback uses."""

    def __init__(self, step):
        self.global_step = step
        self.current_epoch = 2
        self.should_stop = False
        self.saved = []

    def save_checkpoint(self, path):
        with open(path, "wb") as f:
            f.write(b"lightning checkpoint at %d" % self.global_step)
        self.saved.append(path)


class TestLightning(Base):
    def test_request_saves_last_ckpt_then_stops_and_exits(self):
        cb = spotagent.lightning.Logic(self.agent)
        tr = StandInLightningTrainer(41)
        cb.on_train_batch_end(tr, None, None, None, 0)
        self.assertEqual(tr.saved, [])
        reqdir = self.request("000000000042-l")
        tr.global_step = 42
        cb.on_train_batch_end(tr, None, None, None, 1)
        self.assertEqual(tr.saved, [os.path.join(reqdir, "last.ckpt")])
        done = self.srv.wait_message("done")[0]
        self.assertEqual((done["step"], done["metadata"]["epoch"]), (42, 2))
        self.assertFalse(tr.should_stop)
        self.stop()
        cb.on_train_batch_end(tr, None, None, None, 2)
        self.assertTrue(tr.should_stop)
        with self.assertRaises(SystemExit) as e:
            cb.on_fit_end(tr, None)
        self.assertEqual(e.exception.code, spotagent.EXIT_INTERRUPTED)

    def test_save_error_fails_the_request(self):
        cb = spotagent.lightning.Logic(self.agent)
        tr = StandInLightningTrainer(3)
        tr.save_checkpoint = mock.Mock(side_effect=RuntimeError("disk full"))
        self.request("000000000003-l")
        cb.on_train_batch_end(tr, None, None, None, 0)
        self.assertIn("disk full", self.srv.wait_message("failed")[0]["error"])

    def test_resume_path(self):
        a = types.SimpleNamespace(resume_dir=None)
        self.assertIsNone(spotagent.lightning.resume_path(a))
        a.resume_dir = self.tmp
        self.assertIsNone(spotagent.lightning.resume_path(a))
        open(os.path.join(self.tmp, "last.ckpt"), "w").close()
        self.assertEqual(spotagent.lightning.resume_path(a), os.path.join(self.tmp, "last.ckpt"))


class TestLazyImports(unittest.TestCase):
    def test_no_framework_at_import(self):
        code = ("import sys; sys.path.insert(0, %r); import spotagent.hf, spotagent.lightning, spotagent.dcp; "
                "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning') if m in sys.modules]; "
                "print(bad); sys.exit(1 if bad else 0)") % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_unknown_attribute(self):
        with self.assertRaises(AttributeError):
            spotagent.hf.NoSuchThing  # noqa: B018
        with self.assertRaises(AttributeError):
            spotagent.lightning.NoSuchThing  # noqa: B018


def _torch2():
    try:
        import torch
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return False
    return hasattr(dcp, "save") and int(torch.__version__.split(".")[0]) >= 2


@unittest.skipUnless(_torch2(), "torch.distributed.checkpoint.save needs torch 2.x: runs under scripts/sid-python")
class TestDCP(Base):
    def test_save_into_request_and_load_back(self):
        import torch

        reqdir = self.request("000000000012-d", "periodic")
        req = self.agent.poll(12)
        state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5)}
        h = spotagent.dcp.save(req, state, 12, metadata={"k": 1})
        self.assertTrue(h.wait(DEADLINE))
        self.assertIsNone(h.error)
        done = self.srv.wait_message("done")[0]
        self.assertEqual((done["step"], done["metadata"]), (12, {"k": 1}))
        self.assertTrue(os.path.isfile(os.path.join(reqdir, ".metadata")))
        back = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
        stats = spotagent.dcp.load(reqdir, back)
        self.assertTrue(torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"]))
        self.assertEqual(stats.files, {"__0_0.distcp"})
        self.assertGreaterEqual(stats.bytes, (12 + 5) * 4)  # the tensors, each serialized with torch.save
        self.assertLessEqual(stats.bytes, os.path.getsize(os.path.join(reqdir, "__0_0.distcp")))
        # A node's copy of the metadata serves as well (a node > 0's part).
        os.rename(os.path.join(reqdir, ".metadata"), os.path.join(reqdir, spotagent.dcp.metadata_copy_name(1)))
        back = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
        spotagent.dcp.load(reqdir, back)
        self.assertTrue(torch.equal(back["w"], state["w"]))

    def test_load_without_metadata(self):
        with self.assertRaises(FileNotFoundError):
            spotagent.dcp.load(self.tmp, {})


if __name__ == "__main__":
    unittest.main()
