#!/usr/bin/env python3
"""Device check, case 3: the real Hugging Face Trainer under
``spotagent run --watch OUT``, with no spotagent code in it.

A tiny Llama built from a config (no download), ``save_steps`` and
``save_total_limit=2`` (the Trainer rotates its checkpoint-N directories),
and on start ``resume_from_checkpoint`` with the newest checkpoint in
--output-dir, as its users write it. Deterministic (``full_determinism``,
``seed``/``data_seed``, no dropout): a resumed run's final weights equal an
uninterrupted run's (``sha256`` in the --out JSON). Eager attention: the
fused kernels' backward passes need not be deterministic.

    python3 hf_trainer.py --output-dir out --steps 120 --save-steps 10 --out result.json
"""

import argparse
import hashlib
import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

VOCAB, SEQ, SAMPLES = 128, 32, 2048


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.data = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        x = self.data[i]
        return {"input_ids": x, "labels": x.clone()}


class Pace(TrainerCallback):
    """Prints each step; sleeps --step-time (the check's pacing)."""

    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        if self.step_time > 0:
            time.sleep(self.step_time)
        print("step %d" % state.global_step, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                      attention_dropout=0.0, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=8,
        learning_rate=1e-3, save_strategy="steps", save_steps=args.save_steps, save_total_limit=2,
        logging_strategy="no", report_to="none", seed=0, data_seed=0, full_determinism=True,
        dataloader_num_workers=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[Pace(args.step_time)])
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    print("resuming from %s" % last if last else "starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=last)
    h = hashlib.sha256()
    for p in trainer.model.parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    with open(args.out, "w") as f:
        json.dump({"sha256": h.hexdigest(), "step": trainer.state.global_step, "resumed_from": last}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
