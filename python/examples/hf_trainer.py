#!/usr/bin/env python3
"""The Hugging Face Trainer under spotagent: a tiny GPT-2 (made from a
config: no download) trained on synthetic tokens, resumed exactly.

Two ways, one script:

  --mode callback (default): spotagent.hf.SpotagentCallback answers the
    agent's checkpoint requests with the Trainer's own save, stops when the
    agent says so, and the process exits with the agent's exit code (75
    after an interruption); a restart resumes from the agent's restore.

        spotagent run --store s3://bucket/runs/gpt2 -- python3 hf_trainer.py --output-dir out

  --mode watch: no spotagent import (zero-code mode). The Trainer saves
    checkpoint-<step> every --save-steps; the agent commits each one, and
    restores the newest into OUTPUT_DIR before a restart, which resumes
    with get_last_checkpoint. --jit turns on transformers'
    enable_jit_checkpoint (a save on SIGTERM; pair it with the agent's
    --notice-signal SIGTERM).

        spotagent run --store URI --watch out --notice-signal SIGTERM -- \\
            python3 hf_trainer.py --mode watch --jit --output-dir out --save-steps 10

Prints `resuming from <dir> at step <n>` or `starting fresh`, `step <n>`
after every step, and at the end `final sha256=<hex> step=<n>` (the sha256
of the parameters): an interrupted and resumed run ends with the line of
an uninterrupted one. Needs torch 2.x and transformers (Debian unstable's
python3-transformers; scripts/sid-python runs it here).
"""

import argparse
import hashlib
import os
import sys
import time
from typing import Any, Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

SEED = 0
VOCAB, CONTEXT, SAMPLES = 128, 32, 512


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """SAMPLES sequences of CONTEXT tokens with a learnable pattern."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(SEED)
        start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
        stride = torch.randint(1, 7, (SAMPLES, 1), generator=g)
        self.ids = (start + stride * torch.arange(CONTEXT)) % VOCAB

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):  # type: ignore[misc]
    """Prints each step (and sleeps --step-sleep-ms: time for a signal)."""

    def __init__(self, sleep_ms: float) -> None:
        self.sleep = sleep_ms / 1000.0

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        print("step %d" % state.global_step, flush=True)
        if self.sleep > 0:
            time.sleep(self.sleep)


def digest(model: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode() + b"\0" + t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--mode", choices=("callback", "watch"), default="callback")
    ap.add_argument("--jit", action="store_true", help="enable_jit_checkpoint (transformers 5)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-steps", type=int, default=0, help="the Trainer's own saves (0: none; watch mode: 10)")
    ap.add_argument("--step-sleep-ms", type=float, default=0)
    ap.add_argument("--cuda", action="store_true", help="train on the GPU (default: the CPU)")
    a = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    save_steps = a.save_steps or (10 if a.mode == "watch" else 0)
    kw = dict(output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=8,
              learning_rate=3e-3, seed=SEED, report_to="none", use_cpu=not a.cuda, disable_tqdm=True,
              dataloader_num_workers=0, logging_strategy="no",
              save_strategy="steps" if save_steps else "no", save_steps=save_steps or None,
              save_total_limit=2)  # type: Dict[str, Any]
    if a.jit:
        kw["enable_jit_checkpoint"] = True
    args = TrainingArguments(**kw)

    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(config)
    callbacks = [Pace(a.step_sleep_ms)]  # type: list[Any]

    agent = None
    if a.mode == "callback":
        try:
            import spotagent
        except ImportError:  # running from a source checkout
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
            import spotagent
        import spotagent.hf

        agent = spotagent.connect()
        callbacks.append(spotagent.hf.SpotagentCallback(agent))
        resume = spotagent.hf.resume_from_checkpoint(agent)
    else:
        resume = get_last_checkpoint(a.output_dir) if os.path.isdir(a.output_dir) else None
    if resume:
        print("resuming from %s" % resume, flush=True)
    else:
        print("starting fresh", flush=True)

    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    step = trainer.state.global_step
    if agent is not None:
        agent.close()
    if step < a.steps:
        # Stopped early: an enable_jit_checkpoint save on SIGTERM (watch
        # mode; the callback exits with the agent's code itself).
        print("stopped at step %d" % step, flush=True)
        return 0
    print("final sha256=%s step=%d" % (digest(model), step), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
