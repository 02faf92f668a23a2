"""PyTorch Lightning integration: a ``Callback`` that answers the agent's
checkpoint requests with Lightning's own ``trainer.save_checkpoint``.

    import lightning as L
    import spotagent, spotagent.lightning

    agent = spotagent.connect()
    cb = spotagent.lightning.SpotagentCallback(agent)
    trainer = L.Trainer(max_steps=1000, callbacks=[cb])
    trainer.fit(model, datamodule, ckpt_path=spotagent.lightning.resume_path(agent))
    agent.close()
    sys.exit(agent.exit_code)       # 75 after an interruption: run me again

At the end of the training batch after a request arrives, the callback
writes ``<request dir>/last.ckpt`` with ``trainer.save_checkpoint`` (the
full Lightning checkpoint: weights, optimizers, schedulers, loops, callbacks'
state), then reports it ``done`` with the global step and epoch. Once the
agent says stop (after an interruption checkpoint is committed) it sets
``trainer.should_stop``; with ``exit_on_stop`` (the default) the process
exits with the agent's exit code at the end of ``fit``. A restarted run
passes ``resume_path(agent)`` as ``ckpt_path``.

Every rank must run the callback (``save_checkpoint`` is collective: under
DDP global rank 0 writes the file). In a job of several nodes the file is in
node 0's part only: restart the other nodes with ``spotagent run --restore
all`` (docs/frameworks.md).

Lightning (``lightning`` or ``pytorch_lightning``) is imported only when
``SpotagentCallback`` is first used: this module is standard library at
import. The class is a real subclass of Lightning's ``Callback``.
"""

import importlib
import os
import sys
from typing import Any, Dict, Optional

__all__ = ["SpotagentCallback", "CHECKPOINT_NAME", "resume_path", "Logic"]

#: The file name written into the request's directory.
CHECKPOINT_NAME = "last.ckpt"


def resume_path(agent: Any) -> Optional[str]:
    """The checkpoint file to pass to ``trainer.fit(ckpt_path=...)``: the
    agent's restored ``last.ckpt``, or None for a fresh start."""
    d = agent.resume_dir
    if not d:
        return None
    p = os.path.join(d, CHECKPOINT_NAME)
    return p if os.path.isfile(p) else None


class Logic(object):
    """The callback's behaviour on Lightning's hooks, without Lightning (the
    class ``SpotagentCallback`` puts it on a Lightning ``Callback``)."""

    def __init__(self, agent: Any = None, exit_on_stop: bool = True) -> None:
        if agent is None:
            from . import connect

            agent = connect()
        self.agent = agent
        self.exit_on_stop = exit_on_stop
        #: Steps of the checkpoints this callback saved (tests, logs).
        self.saved = []  # type: list[int]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        req = self.agent.poll(step)
        if req is not None:
            path = os.path.join(req.dir, CHECKPOINT_NAME)
            try:
                trainer.save_checkpoint(path)
            except Exception as e:  # the request fails, training goes on
                req.fail("save_checkpoint: %s" % e)
            else:
                meta = {"global_step": step, "epoch": int(trainer.current_epoch),
                        "framework": "lightning"}  # type: Dict[str, Any]
                req.done(step, metadata=meta)
                self.saved.append(step)
        if self.agent.should_stop:
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.exit_on_stop and self.agent.should_stop:
            self.agent.close()
            sys.exit(self.agent.exit_code)


_class = None  # type: Any


def _callback_class() -> Any:
    global _class
    if _class is None:
        try:
            Callback = importlib.import_module("lightning.pytorch.callbacks").Callback
        except ImportError:
            Callback = importlib.import_module("pytorch_lightning.callbacks").Callback
        _class = type("SpotagentCallback", (Logic, Callback), {"__module__": __name__, "__doc__": Logic.__doc__})
    return _class


def __getattr__(name: str) -> Any:
    # SpotagentCallback is made on first use (PEP 562): importing this module
    # does not import Lightning.
    if name == "SpotagentCallback":
        return _callback_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
