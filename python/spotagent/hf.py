"""Hugging Face ``Trainer`` integration: a ``TrainerCallback`` that answers
the agent's checkpoint requests with the Trainer's own save.

    import spotagent, spotagent.hf
    from transformers import Trainer

    agent = spotagent.connect()
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[spotagent.hf.SpotagentCallback(agent)])
    trainer.train(resume_from_checkpoint=spotagent.hf.resume_from_checkpoint(agent))
    agent.close()
    sys.exit(agent.exit_code)       # 75 after an interruption: run me again

What it does, on the Trainer's events:

* ``on_step_end``: polls the agent with the global step. A checkpoint
  request sets ``control.should_save``: the Trainer saves
  ``<output_dir>/checkpoint-<step>`` itself right after (weights, optimizer,
  scheduler, every RNG, ``trainer_state.json``), exactly as at a
  ``save_steps`` step, so resuming from it is the Trainer's own resume.
* ``on_save``: the files of that checkpoint are hard-linked into the
  request's directory (copied when it is on another filesystem) and
  reported ``done`` with the global step and epoch. Later writes into
  ``output_dir`` (rotation by ``save_total_limit``) cannot touch the linked
  copy: the Trainer deletes and creates files, it never rewrites one.
* Once the agent says stop (its interruption checkpoint is committed) it
  sets ``control.should_training_stop``; with ``exit_on_stop`` (the default)
  the process exits with the agent's exit code (75) at ``on_train_end``, so
  that nothing after ``train()`` (a final ``save_model``) runs as if the run
  were finished.
* A restarted run resumes through ``resume_from_checkpoint(agent)``: the
  agent's restored directory is the Trainer's checkpoint directory.

SIGTERM and ``enable_jit_checkpoint`` (transformers 5): the agent wins. With
an agent, the callback installs the client's SIGTERM handler at
``on_train_begin``, after the Trainer's JIT handler, so one SIGTERM becomes
one checkpoint (the agent's ``shutdown`` request, saved by the Trainer at
the next step end, committed, then exit 75), never two savers racing.
Without an agent (``SPOTAGENT_SOCKET`` unset) the callback leaves SIGTERM to
the Trainer. Zero-code mode (``spotagent run --watch OUTPUT_DIR``, no
callback) needs nothing here: the agent commits a ``checkpoint-<step>``
once ``trainer_state.json`` is in it and ``checkpoint-is-incomplete.txt``
(the sentinel of a JIT save in progress) is not.

transformers is imported only when ``SpotagentCallback`` is first used
(PEP 562): this module is standard library at import, and the class is a
real subclass of ``transformers.TrainerCallback``.
"""

import errno
import importlib
import os
import shutil
import sys
from typing import Any, Dict, List, Optional

__all__ = ["SpotagentCallback", "Logic", "resume_from_checkpoint", "link_tree", "INCOMPLETE_SENTINEL"]

#: The file transformers' JIT checkpoint keeps in a checkpoint directory
#: while it is being written.
INCOMPLETE_SENTINEL = "checkpoint-is-incomplete.txt"
#: The file the Trainer writes last into a checkpoint directory.
TRAINER_STATE = "trainer_state.json"


def resume_from_checkpoint(agent: Any) -> Optional[str]:
    """What to pass to ``trainer.train(resume_from_checkpoint=...)``: the
    agent's restored checkpoint directory when it is a Trainer checkpoint
    (holds ``trainer_state.json``, no incomplete sentinel), else None (a
    fresh start). Blocks while the agent still restores."""
    d = agent.resume_dir
    if not d or not os.path.isdir(d):
        return None
    if not os.path.isfile(os.path.join(d, TRAINER_STATE)) or os.path.exists(os.path.join(d, INCOMPLETE_SENTINEL)):
        return None
    return str(d)


def link_tree(src: str, dst: str) -> List[str]:
    """Hard-links every file under src to the same path under dst (a copy
    where a link cannot be made: another filesystem); returns the relative
    paths. The incomplete sentinel is left out."""
    out = []  # type: List[str]
    for base, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(base, src)
        target = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(target, exist_ok=True)
        for name in sorted(files):
            if rel == "." and name == INCOMPLETE_SENTINEL:
                continue
            s, d = os.path.join(base, name), os.path.join(target, name)
            try:
                os.link(s, d)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copy2(s, d)
            out.append(os.path.normpath(os.path.join(rel, name)))
    return out


class Logic(object):
    """The callback's behaviour on the Trainer's events, without
    transformers (``SpotagentCallback`` puts it on a ``TrainerCallback``).

    agent: a ``spotagent.Agent`` (default: ``spotagent.connect()``).
    exit_on_stop: exit with the agent's exit code at ``on_train_end`` once
    the agent said stop.
    handle_sigterm: install the client's SIGTERM handler at
    ``on_train_begin`` when there is an agent (replacing the Trainer's JIT
    handler): None (default) means yes when connected to an agent.
    """

    def __init__(self, agent: Any = None, exit_on_stop: bool = True, handle_sigterm: Optional[bool] = None) -> None:
        if agent is None:
            from . import connect

            agent = connect()
        self.agent = agent
        self.exit_on_stop = exit_on_stop
        self.handle_sigterm = handle_sigterm
        self._pending = None  # type: Any  # the request the Trainer saves next
        #: (step, checkpoint directory) of each request answered (tests, logs).
        self.saved = []  # type: List[Any]

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        want = self.handle_sigterm
        if want is None:
            want = bool(getattr(self.agent, "enabled", False))
        if want:
            # After the Trainer's own (JIT) handler, which it installs before
            # any callback's on_train_begin runs or in its own: ours replaces it.
            self.agent.handle_sigterm()
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        step = int(state.global_step)
        if self._pending is None:
            req = self.agent.poll(step)
            if req is not None:
                self._pending = req
                control.should_save = True
        if self._pending is None and self.agent.should_stop:
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        req, self._pending = self._pending, None
        step = int(state.global_step)
        if req is not None:
            ckpt = os.path.join(args.output_dir, "checkpoint-%d" % step)
            try:
                if not os.path.isfile(os.path.join(ckpt, TRAINER_STATE)):
                    raise OSError("%s has no %s" % (ckpt, TRAINER_STATE))
                link_tree(ckpt, req.dir)
            except OSError as e:
                req.fail("link %s: %s" % (ckpt, e))
            else:
                meta = {"global_step": step, "epoch": state.epoch, "checkpoint": os.path.basename(ckpt),
                        "framework": "transformers"}  # type: Dict[str, Any]
                req.done(step, metadata=meta)
                self.saved.append((step, ckpt))
        if self.agent.should_stop:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        if self._pending is not None:
            # Training ended before the Trainer saved (max_steps reached at
            # the same step end): the request is not answered.
            self._pending.fail("training ended before the checkpoint was saved")
            self._pending = None
        if self.exit_on_stop and self.agent.should_stop:
            self.agent.close()
            sys.exit(self.agent.exit_code)
        return None


_class = None  # type: Any


def _callback_class() -> Any:
    global _class
    if _class is None:
        TrainerCallback = importlib.import_module("transformers").TrainerCallback
        _class = type("SpotagentCallback", (Logic, TrainerCallback), {"__module__": __name__, "__doc__": Logic.__doc__})
    return _class


def __getattr__(name: str) -> Any:
    # SpotagentCallback is made on first use (PEP 562): importing this module
    # does not import transformers.
    if name == "SpotagentCallback":
        return _callback_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
