"""A warmup longer than the run, TrainingArguments(max_steps=2, warmup_steps=5), is accepted as Hugging
Face accepts it (the learning rate rises and never reaches its peak); each step's learning rate
(log_history) equals transformers' own scheduler's, warmup longer or shorter than the run."""
import os
import tempfile

from tiny import corpus_ids, tiny_llama_dir

import torch
from transformers import AutoModelForCausalLM, TrainingArguments
from transformers.optimization import get_scheduler

import megatrain as mt

LR = 1e-3
base = tiny_llama_dir(seed=4)
work = tempfile.mkdtemp(prefix="mt-py-schedule-")
ids = corpus_ids(6000)
dataset = [{"input_ids": ids[i:i + 33]} for i in range(0, len(ids) - 33, 33)]


def hf_learning_rates(schedule, warmup, steps):
    """The learning rate transformers' scheduler gives each optimizer step."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = get_scheduler(schedule, opt, num_warmup_steps=warmup, num_training_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return rates


for schedule, warmup, steps in [("linear", 5, 2), ("cosine", 5, 3), ("constant_with_warmup", 4, 2),
                                ("linear", 2, 4)]:
    what = f"{schedule}, warmup_steps={warmup}, max_steps={steps}"
    args = TrainingArguments(output_dir=os.path.join(work, f"{schedule}-{warmup}-{steps}"), report_to=[],
                             max_steps=steps, per_device_train_batch_size=1, learning_rate=LR,
                             lr_scheduler_type=schedule, warmup_steps=warmup, save_steps=100)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    trainer = mt.Trainer(model=model, train_dataset=dataset, args=args)
    result = trainer.train()
    assert result.global_step == steps, (what, result)
    engine = [r["lr"] for r in trainer.log_history]
    want = hf_learning_rates(schedule, warmup, steps)
    assert len(engine) == steps, (what, trainer.log_history)
    for step, (e, w) in enumerate(zip(engine, want), start=1):
        # The engine's rate is the float the update used.
        assert abs(e - w) <= 1e-7 * LR, f"{what}: step {step} lr {e}, transformers {w}"
    if warmup > steps:
        assert max(engine) < LR * steps / warmup + 1e-9, f"{what}: reached {max(engine)}"
    print(f"ok: {what}: learning rates {engine} = transformers'")
