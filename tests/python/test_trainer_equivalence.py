"""Three steps through mt.Trainer equal three steps through `megatrain train` with the same engine
arguments (the binary starting from the same weights saved as a Hugging Face directory) bit for bit,
and match three steps of torch.optim.AdamW on the transformers model within tolerance.

The data is one window of 33 tokens (batch 1, no accumulation), so every step trains on the same
sequence and torch sees exactly the engine's inputs and targets: model(x, labels=x) with x the window
predicts tokens 1..32 from 0..31, as the engine's window does."""
import json
import os
import subprocess
import tempfile

from tiny import BINARY, assert_same_bits, corpus_ids, read_hf, tiny_llama_dir

import torch
from transformers import AutoModelForCausalLM, TrainingArguments

import megatrain as mt

T, STEPS, LR = 32, 3, 1e-3
base = tiny_llama_dir(seed=1)
work = tempfile.mkdtemp(prefix="mt-py-equiv-")
window = corpus_ids(2000)[:T + 1]

model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
args = TrainingArguments(output_dir=os.path.join(work, "trainer"), per_device_train_batch_size=1,
                         gradient_accumulation_steps=1, max_steps=STEPS, learning_rate=LR, lr_scheduler_type="constant",
                         weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                         logging_steps=1, report_to=[])
trainer = mt.Trainer(model=model, train_dataset=[{"input_ids": window}], args=args, max_seq_length=T)
result = trainer.train()
assert result.global_step == STEPS, result

# The binary: the same engine arguments, the starting weights from the saved directory.
export = os.path.join(work, "binary-export")
argv = [a for a in trainer.arguments if not a.startswith(("--model.config_file=", "--train.output_dir="))]
argv += [f"--model.model_name_or_path={base}", f"--train.output_dir={os.path.join(work, 'binary')}",
         f"--train.export_hf_dir={export}"]
subprocess.run([BINARY, "train", *argv], check=True, stdout=subprocess.DEVNULL)
assert_same_bits(model.state_dict(), read_hf(export), "mt.Trainer vs megatrain train")


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


ours = losses(os.path.join(work, "trainer", "train.jsonl"))
theirs = losses(os.path.join(work, "binary", "train.jsonl"))
assert ours == theirs and len(ours) == STEPS, (ours, theirs)
assert [r["loss"] for r in trainer.log_history] == ours

# torch.optim.AdamW on the transformers model, clipping as the engine does (global norm before the step).
ref = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
x = torch.tensor([window])
torch_losses = []
for _ in range(STEPS):
    loss = ref(x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    torch_losses.append(loss.item())
for a, b in zip(ours, torch_losses):
    assert abs(a - b) < 1e-4 * max(1.0, abs(b)), (ours, torch_losses)
start = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).state_dict()
diffs = []
for name, p in ref.state_dict().items():
    if name.endswith("inv_freq"):
        continue
    assert (p - start[name]).abs().max().item() > 0, f"{name}: torch did not move it"
    diffs.append((model.state_dict()[name] - p).abs().flatten())
diffs = torch.cat(diffs)
worst, typical = diffs.max().item(), diffs.quantile(0.999).item() if diffs.numel() < 16_000_000 else 0.0
# Each step moves a weight by about lr. Adam divides by sqrt(v), so where a gradient is near zero the
# fp32 rounding of a different summation order shows up as a small fraction of a step; elsewhere the
# two agree to a tiny fraction of it.
assert worst < 0.05 * LR, f"mt.Trainer vs torch AdamW: max |diff| {worst}"
assert typical < 1e-3 * LR, f"mt.Trainer vs torch AdamW: 99.9th percentile |diff| {typical}"
print(f"ok: trainer = binary bit for bit over {STEPS} steps; vs torch AdamW max |diff| {worst:.3g} "
      f"(99.9% under {typical:.3g}), losses {ours} vs {torch_losses}")
