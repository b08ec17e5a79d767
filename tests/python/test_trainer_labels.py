"""mt.Trainer honours Hugging Face's `labels` and `attention_mask`.

1. Examples whose prompt is labelled -100 (and one padded example): the loss of each of 3 steps and
   the weights after them equal PyTorch (float64) with transformers' semantics on the same windows: the
   model's own loss (labels shifted inside it, -100 ignored) with num_items_in_batch = the step's target
   count, as transformers >= 4.46 computes it under gradient accumulation, then clipping and AdamW.
2. labels = input_ids trains to the same bits as no labels.
3. The same records as pre-tokenized JSONL through `megatrain-data shards --format jsonl` and `megatrain
   train`: the same shard bytes and the same weights.
4. Labels of another length, a label that is neither -100 nor its input id, a bad attention_mask: a
   ConfigError naming the example and the field (megatrain-data: the file, line and field), and no shard
   left behind. A step whose labels mask every token: 0 targets, loss 0, "loss none" in its step line.
"""
import json
import logging
import os
import subprocess
import sys
import tempfile

from tiny import BINARY, SHARED, assert_same_bits, corpus_ids, read_hf, tiny_llama_dir

import numpy as np
import torch
from transformers import AutoModelForCausalLM, TrainingArguments

import megatrain as mt

DATA_TOOL = os.environ.get("MEGATRAIN_DATA_TOOL", "")
if not os.path.isfile(DATA_TOOL) or not os.path.isfile(BINARY):
    print("skipped: MEGATRAIN_DATA_TOOL or MEGATRAIN_BINARY is not set")
    sys.exit(77)
T, STEPS, LR = 32, 3, 1e-3
EX = 13  # 5 examples of 13 tokens = 65 = 2 windows of 33 with stride 32
# Prompt lengths: the two windows hold 27 and 10 targets, so the step's mean over targets differs from the
# mean of the micro-batches' means (transformers before 4.46 under gradient accumulation).
PROMPTS = [2, 2, 2, 11, 11]
base = tiny_llama_dir(seed=2)
work = tempfile.mkdtemp(prefix="mt-py-labels-")
ids = corpus_ids(4000)[:5 * EX]
PAD = 50256

examples, stream_mask = [], []
for k, prompt in enumerate(PROMPTS):
    x = ids[k * EX:(k + 1) * EX]
    labels = [-100] * prompt + x[prompt:]
    ex = {"input_ids": x, "labels": labels}
    if k == 2:  # right padding, as a padded batch holds it: dropped from the stream
        ex = {"input_ids": x + [PAD] * 3, "labels": labels + [-100] * 3, "attention_mask": [1] * EX + [0] * 3}
    examples.append(ex)
    stream_mask += [0] * prompt + [1] * (EX - prompt)
stream = torch.tensor(ids)
mask = torch.tensor(stream_mask, dtype=torch.bool)


def args(out, steps=STEPS):
    return TrainingArguments(output_dir=out, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                             max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0,
                             adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, logging_steps=1,
                             report_to=[], seed=7)


# The stream packing these windows assume (the engine's default, named once the key exists).
STREAM = {"data.packing": "stream"} if "data.packing" in mt.engine_keys() else {}


def trainer_for(dataset, out, steps=STEPS):
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    return model, mt.Trainer(model=model, train_dataset=dataset, args=args(out, steps), max_seq_length=T,
                             engine_args=STREAM)


def train(dataset, name):
    model, trainer = trainer_for(dataset, os.path.join(work, name))
    result = trainer.train()
    assert result.global_step == STEPS, result
    return model, trainer


# 1. labels and padding vs transformers + torch AdamW.
model, trainer = train(examples, "labels")
ours = [r["loss"] for r in trainer.log_history]
targets = [r["tokens"] for r in trainer.log_history]
windows = [stream[0:T + 1], stream[T:2 * T + 1]]
window_labels = [torch.where(mask[s:s + T + 1], stream[s:s + T + 1], torch.tensor(-100)) for s in (0, T)]
counted = sum(int((lab[1:] != -100).sum()) for lab in window_labels)  # labels[0] is never predicted
assert targets == [counted] * STEPS, (targets, counted)
assert counted < 2 * T, "the prompt halves are not targets"

# The reference runs in float64: where Adam divides a near-zero gradient by its own size, torch's fp32
# rounding alone moves a few weights by a large part of a step (measured: 0.27 lr here), the engine's
# double-accumulated norms and fp32 steps stay much closer to the exact result.
ref = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).double()
opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
torch_losses = []
for _ in range(STEPS):
    step_loss = 0.0
    for x, lab in zip(windows, window_labels):  # one micro-batch each; each step sees both windows
        loss = ref(x[None], labels=lab[None], num_items_in_batch=counted).loss
        loss.backward()
        step_loss += loss.item()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    torch_losses.append(step_loss)
for a, b in zip(ours, torch_losses):
    assert abs(a - b) < 1e-5 * max(1.0, abs(b)), (ours, torch_losses)
with torch.no_grad():  # the same windows with every token a target: another loss, so the mask mattered
    start = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    unmasked = start(windows[0][None], labels=windows[0][None]).loss.item()
    masked_first = start(windows[0][None], labels=window_labels[0][None]).loss.item()
    masked_second = start(windows[1][None], labels=window_labels[1][None]).loss.item()
assert abs(unmasked - masked_first) > 1e-3, (unmasked, masked_first)
mean_of_means = (masked_first + masked_second) / 2  # transformers < 4.46 under gradient accumulation
assert abs(ours[0] - mean_of_means) > 20 * 1e-5 * abs(ours[0]), (ours[0], mean_of_means)  # the check above sees it
diffs = []
for name, p in ref.state_dict().items():
    if name.endswith("inv_freq"):
        continue
    diffs.append((model.state_dict()[name].double() - p).abs().flatten())
diffs = torch.cat(diffs)
worst, typical = diffs.max().item(), diffs.float().quantile(0.999).item()
# As in test_trainer_equivalence.py: fp32 rounding shows up as a small fraction of one step (lr).
assert worst < 0.05 * LR, f"mt.Trainer with labels vs torch AdamW (fp64): max |diff| {worst}"
assert typical < 1e-3 * LR, f"mt.Trainer with labels vs torch AdamW (fp64): 99.9th percentile |diff| {typical}"
print(f"ok: labels + padding: losses {ours} vs torch fp64 {torch_losses} (mean of micro-batch means: "
      f"{mean_of_means:.6f}); {counted} targets a step; "
      f"weights max |diff| {worst:.3g} (99.9% under {typical:.3g})")

# 3. The same records as pre-tokenized JSONL through `megatrain-data shards` and `megatrain train`: the same
# shard (ids and mask) and the same weights, bit for bit.
jsonl = os.path.join(work, "records.jsonl")
with open(jsonl, "w") as f:
    for ex in examples:
        f.write(json.dumps(ex) + "\n")
shards = os.path.join(work, "tool-shards")
subprocess.run([DATA_TOOL, "shards", "--format", "jsonl", "--tokenizer", os.path.join(SHARED, "gpt2-bpe"), "--out",
                shards, jsonl], check=True, stdout=subprocess.DEVNULL)
for ext in (".bin", ".mask", ".docs"):
    with open(os.path.join(shards, "train_000000" + ext), "rb") as a, \
            open(os.path.join(work, "labels", "data", "train_000000" + ext), "rb") as b:
        assert a.read() == b.read(), f"megatrain-data's {ext} differs from mt.Trainer's"
export = os.path.join(work, "binary-export")
argv = [a for a in trainer.arguments
        if not a.startswith(("--model.config_file=", "--train.output_dir=", "--data.train_files="))]
argv += [f"--model.model_name_or_path={base}", f"--train.output_dir={os.path.join(work, 'binary')}",
         f"--train.export_hf_dir={export}", f"--data.train_files={os.path.join(shards, 'train_*.bin')}"]
subprocess.run([BINARY, "train", *argv], check=True, stdout=subprocess.DEVNULL)
assert_same_bits(model.state_dict(), read_hf(export), "mt.Trainer vs megatrain-data shards + megatrain train")
print("ok: the records as pre-tokenized JSONL through megatrain-data + megatrain train: same shard, same bits")

# 3b. Several shard paths handed to mt.Trainer are linked with their sidecars (loss mask, document starts):
# documents packing over them equals `megatrain train` on the same shards by glob.
split = os.path.join(work, "split-shards")
subprocess.run([DATA_TOOL, "shards", "--format", "jsonl", "--tokenizer", os.path.join(SHARED, "gpt2-bpe"), "--out",
                split, "--shard-tokens", "40", jsonl], check=True, stdout=subprocess.DEVNULL)
paths = sorted(os.path.join(split, f) for f in os.listdir(split) if f.startswith("train_") and f.endswith(".bin"))
assert len(paths) >= 2, paths
docs_model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
docs_trainer = mt.Trainer(model=docs_model, train_dataset=paths, args=args(os.path.join(work, "paths"), 2),
                          max_seq_length=T, engine_args={"data.packing": "documents"})
docs_trainer.train()
export = os.path.join(work, "paths-binary-export")
argv = [a for a in docs_trainer.arguments
        if not a.startswith(("--model.config_file=", "--train.output_dir=", "--data.train_files="))]
argv += [f"--model.model_name_or_path={base}", f"--train.output_dir={os.path.join(work, 'paths-binary')}",
         f"--train.export_hf_dir={export}", f"--data.train_files={os.path.join(split, 'train_*.bin')}"]
subprocess.run([BINARY, "train", *argv], check=True, stdout=subprocess.DEVNULL)
assert_same_bits(docs_model.state_dict(), read_hf(export), "mt.Trainer on shard paths vs megatrain train by glob")
print(f"ok: {len(paths)} shard paths with their .mask and .docs: the same bits as megatrain train by glob")

# 2. labels = input_ids: the same bits as no labels.
plain_model, plain = train([{"input_ids": ids}], "plain")
same_model, same = train([{"input_ids": ids, "labels": ids}], "labels-equal-ids")
assert [r["loss"] for r in plain.log_history] == [r["loss"] for r in same.log_history]
assert_same_bits(plain_model.state_dict(), {k: v for k, v in same_model.state_dict().items()
                                            if not k.endswith("inv_freq")}, "labels = input_ids vs no labels")
print(f"ok: labels = input_ids equals no labels bit for bit (losses {[r['loss'] for r in plain.log_history]})")


# 4. Bad input: the front door, then the same records through megatrain-data.
def expect_error(dataset, *needles):
    out = os.path.join(work, "bad")
    _, trainer = trainer_for(dataset, out)
    try:
        trainer.train()
    except mt.ConfigError as e:
        for n in needles:
            assert n in str(e), (n, str(e))
        data_dir = os.path.join(out, "data")
        left = [f for f in os.listdir(data_dir) if f.startswith("train_")] if os.path.isdir(data_dir) else []
        assert not left, f"shards left behind: {left}"
        return str(e)
    raise AssertionError(f"no error for {needles}")


good = {"input_ids": ids[:20], "labels": ids[:20]}
print(expect_error([good, {"input_ids": ids[:20], "labels": ids[:19]}],
                   "example 1", "'labels' has 19 entries, 'input_ids' has 20"))
wrong = list(ids[:20])
wrong[3] = wrong[4]
print(expect_error([good, good, {"input_ids": ids[:20], "labels": wrong}],
                   "example 2", f"labels[3] = {wrong[3]} is neither -100 nor input_ids[3] = {ids[3]}"))
print(expect_error([good, {"input_ids": ids[:20], "attention_mask": [1] * 21}],
                   "example 1", "'attention_mask' has 21 entries"))
print(expect_error([good, {"input_ids": ids[:20], "attention_mask": [2] * 20}],
                   "example 1", "attention_mask[0] = 2"))
print(expect_error([{"input_ids": ids[:20]}, good], "example 1 has 'labels'", "example 0 has neither"))
# A step whose window is all prompt: 0 targets, a finite loss of 0 and no update from it.
_, masked_all = trainer_for([{"input_ids": ids, "labels": [-100] * len(ids)}], os.path.join(work, "all-masked"), 1)
lines = []
handler = logging.Handler()
handler.emit = lambda rec: lines.append(rec.getMessage())
logging.getLogger("megatrain").addHandler(handler)
logging.getLogger("megatrain").setLevel(logging.INFO)
masked_all.train()
logging.getLogger("megatrain").removeHandler(handler)
step_lines = [line for line in lines if line.startswith("step ")]
assert step_lines and "loss none | 0 targets (every token of the step is masked)" in step_lines[0], step_lines
record = masked_all.log_history[0]
assert record["tokens"] == 0 and record["loss"] == 0.0 and np.isfinite(record["grad_norm"]), record
print(f"ok: a fully masked step logs {record['tokens']} targets, loss {record['loss']}: {step_lines[0][:80]}")

tool_cases = [
    ({"input_ids": ids[:20], "labels": ids[:19]}, "field 'labels' has 19 entries, 'input_ids' has 20"),
    ({"input_ids": ids[:20], "labels": wrong}, f"labels[3] = {wrong[3]} is neither -100 nor input_ids[3] = {ids[3]}"),
    ({"input_ids": ids[:20], "attention_mask": [1] * 19}, "field 'attention_mask' has 19 entries"),
    ({"input_ids": ids[:3] + ["x"]}, "input_ids[3] is not an integer"),
    ({"input_ids": [50257]}, "input_ids[0] = 50257 is outside the tokenizer's vocabulary of 50257"),
    ({"text": "a text among token records"}, "record has 'text' but the file's first record is pre-tokenized"),
]
bad_out = os.path.join(work, "tool-bad")
for record, needle in tool_cases:
    path = os.path.join(work, "bad.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    p = subprocess.run([DATA_TOOL, "shards", "--format", "jsonl", "--tokenizer", os.path.join(SHARED, "gpt2-bpe"),
                        "--out", bad_out, path], capture_output=True, text=True)
    assert p.returncode == 1 and f"{path}:2: " in p.stderr and needle in p.stderr, (needle, p.stderr)
    assert not [f for f in os.listdir(bad_out) if f.startswith("train_")], os.listdir(bad_out)
    print(f"ok: {p.stderr.strip()}")
