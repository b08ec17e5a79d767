"""Bad arguments are clear Python exceptions naming the problem (and never crash the interpreter);
fields without effect are warned once; Ctrl-C stops after the step in progress with a final
checkpoint, and resuming from it ends bit-identical to an uninterrupted run."""
import logging
import json
import os
import signal
import tempfile

from tiny import corpus_ids, tiny_llama_dir

import numpy as np
import torch
from transformers import AutoModelForCausalLM, OPTConfig, OPTForCausalLM, TrainingArguments

import megatrain as mt

base = tiny_llama_dir(seed=2)
work = tempfile.mkdtemp(prefix="mt-py-errors-")
ids = corpus_ids(6000)
dataset = [{"input_ids": ids[i:i + 33]} for i in range(0, len(ids) - 33, 33)]


def model():
    return AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)


def expect_error(kind, words, make):
    try:
        make()
    except kind as e:
        text = str(e)
        for w in words:
            assert w in text, f"error {text!r} does not name {w!r}"
        return text
    raise AssertionError(f"no {kind.__name__} naming {words}")


def args(**kw):
    return TrainingArguments(output_dir=os.path.join(work, "out"), report_to=[], max_steps=2,
                             per_device_train_batch_size=1, **kw)


# The model: an architecture the engine does not have, something that is not a model, a missing path.
opt = OPTForCausalLM(OPTConfig(hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
                               vocab_size=100, word_embed_proj_dim=16))
expect_error(mt.ConfigError, ["model_type", "opt", "llama"], lambda: mt.Trainer(model=opt, train_dataset=dataset))
expect_error(mt.ConfigError, ["model", "dict"], lambda: mt.Trainer(model={"a": 1}, train_dataset=dataset))
expect_error(mt.ConfigError, ["config.json"], lambda: mt.Trainer(model=os.path.join(work, "nope"), train_dataset=dataset))

# TrainingArguments fields that would change the result and cannot be honoured.
for field, value in [("label_smoothing_factor", 0.1), ("optim", "sgd"), ("lr_scheduler_type", "polynomial"),
                     ("group_by_length", True), ("neftune_noise_alpha", 5.0)]:
    expect_error(mt.ConfigError, [f"TrainingArguments.{field}"],
                 lambda: mt.Trainer(model=model(), train_dataset=dataset, args=args(**{field: value})))

# Fields without effect on the result: one warning each, once per process.
with_warning = args(dataloader_num_workers=3)
logger = logging.getLogger("megatrain")
records = []
handler = logging.Handler()
handler.emit = records.append
logger.addHandler(handler)
mt.Trainer(model=model(), train_dataset=dataset, args=with_warning)
mt.Trainer(model=model(), train_dataset=dataset, args=with_warning)
logger.removeHandler(handler)
warned = [r.getMessage() for r in records if "dataloader_num_workers" in r.getMessage()]
assert len(warned) == 1, warned

# Datasets: neither ids nor text; text without a tokenizer; ids outside the vocabulary; not a dataset.
expect_error(mt.ConfigError, ["input_ids", "text", "labels"],
             lambda: mt.Trainer(model=model(), train_dataset=[{"labels": [1, 2]}], args=args()))
expect_error(mt.ConfigError, ["text", "tokenizer"],
             lambda: mt.Trainer(model=model(), train_dataset=[{"text": "hello"}], args=args()))
expect_error(mt.ConfigError, ["input_ids", "list of integers"],
             lambda: mt.Trainer(model=model(), train_dataset=[{"input_ids": "words"}], args=args()).train())
expect_error(mt.ConfigError, ["99999", "vocab_size"],
             lambda: mt.Trainer(model=model(), train_dataset=[{"input_ids": [1, 99999] * 40}], args=args()).train())
expect_error(mt.ConfigError, ["train_dataset", "int"], lambda: mt.Trainer(model=model(), train_dataset=5, args=args()))
# Too little data for one sequence: the engine's loader says so.
expect_error(mt.ConfigError, ["tokens", "sequences"],
             lambda: mt.Trainer(model=model(), train_dataset=[{"input_ids": [1, 2, 3]}], args=args()).train())

# Engine keys: the engine's own validation speaks, naming the key.
expect_error(mt.ConfigError, ["train.learning_rate"],
             lambda: mt.Trainer(model=model(), train_dataset=dataset,
                                args={"train.output_dir": os.path.join(work, "d"), "train.learning_rate": -1.0}).train())
expect_error(mt.ConfigError, ["train.nonsense"],
             lambda: mt.Trainer(model=model(), train_dataset=dataset, args={"train.nonsense": 1}).train())
expect_error(mt.ConfigError, ["data.packing", "stream, documents"],
             lambda: mt.Trainer(model=model(), train_dataset=dataset,
                                args={"train.output_dir": os.path.join(work, "p"), "data.packing": "docs"}).train())
expect_error(mt.ConfigError, ["train.optimizer_compression"], lambda: mt.init(optimizer_compression="zip"))
expect_error(mt.ConfigError, ["device.max_vram_gb"], lambda: mt.init(max_vram_gb=-1))
expect_error(mt.ConfigError, ["resume", "step-"],
             lambda: mt.Trainer(model=model(), train_dataset=dataset, args=args()).train(
                 resume_from_checkpoint=os.path.join(work, "missing", "step-00000009")))

# Text with a tokenizer (a tokenizer.json path) trains.
text_out = os.path.join(work, "text")
shared = os.environ.get("MEGATRAIN_SHARED_DATA")
texts = [{"text": open(os.path.join(shared, "corpus", "austen.txt")).read()[:3000]}]
r = mt.Trainer(model=model(), train_dataset=texts, tokenizer=os.path.join(shared, "gpt2-bpe"),
               args=TrainingArguments(output_dir=text_out, report_to=[], max_steps=1, per_device_train_batch_size=1),
               max_seq_length=32).train()
assert r.global_step == 1
# A Hugging Face fast tokenizer: its tokenizer.json runs in the engine's tokenizer; the shard holds
# exactly the ids transformers computes, then the end-of-text token.
from transformers import GPT2TokenizerFast  # noqa: E402

hf_tok = GPT2TokenizerFast(vocab_file=os.path.join(shared, "gpt2-bpe", "encoder.json"),
                           merges_file=os.path.join(shared, "gpt2-bpe", "vocab.bpe"))
hf_out = os.path.join(work, "hf-tokenizer")
hf_trainer = mt.Trainer(model=model(), train_dataset=texts, eval_dataset=texts[:1], tokenizer=hf_tok, max_seq_length=32,
                        args=TrainingArguments(output_dir=hf_out, report_to=[], max_steps=1,
                                               per_device_train_batch_size=1))
hf_trainer.train()
expected = hf_tok(texts[0]["text"])["input_ids"] + [hf_tok.eos_token_id]
for split in ("train", "val"):  # eval_dataset: the engine's data.validation_files
    shard = np.fromfile(os.path.join(hf_out, "data", f"{split}_000000.bin"), dtype="<u2", offset=1024)
    assert shard.tolist() == expected, split
assert any(a.startswith("--data.validation_files=") for a in hf_trainer.arguments)
# The evaluation ran on eval_dataset at the end of the run: a train.jsonl row with eval_loss.
rows = [json.loads(line) for line in open(os.path.join(hf_out, "train.jsonl"))]
assert [r["step"] for r in rows if "eval_loss" in r] == [1], rows

# A Hugging Face `datasets.Dataset` (text column): the same shards as the list of dicts.
import datasets  # noqa: E402

ds_out = os.path.join(work, "datasets")
mt.Trainer(model=model(), train_dataset=datasets.Dataset.from_list(texts),
           eval_dataset=datasets.Dataset.from_list(texts[:1]), tokenizer=hf_tok, max_seq_length=32,
           args=TrainingArguments(output_dir=ds_out, report_to=[], max_steps=1, per_device_train_batch_size=1)).train()
for split in ("train", "val"):
    a = np.fromfile(os.path.join(ds_out, "data", f"{split}_000000.bin"), dtype="<u2", offset=1024)
    assert a.tolist() == expected, f"datasets.Dataset {split} shard"

# A Hugging Face directory as the model: the engine reads it; save_model writes the trained weights.
path_out = os.path.join(work, "from-path")
path_trainer = mt.Trainer(model=base, train_dataset=dataset, max_seq_length=32,
                          args=TrainingArguments(output_dir=path_out, report_to=[], max_steps=1,
                                                 per_device_train_batch_size=1))
assert path_trainer.train().global_step == 1
path_trainer.save_model(os.path.join(path_out, "saved"))
trained = AutoModelForCausalLM.from_pretrained(os.path.join(path_out, "saved"), torch_dtype=torch.float32)
assert not torch.equal(trained.model.norm.weight, model().model.norm.weight)

# Ctrl-C during a run: the step in progress finishes, a final checkpoint is written, train() returns;
# resuming from it ends where an uninterrupted run ends, bit for bit.
STEPS = 8  # long enough that a stop at step 1 lands before the end on a loaded machine


def run(out, stop_at=None, resume=None, m=None):
    m = m or model()

    def on_step(record):
        if record["step"] == stop_at:
            os.kill(os.getpid(), signal.SIGINT)

    trainer = mt.Trainer(model=m, train_dataset=dataset, on_step=on_step, max_seq_length=32,
                         args=TrainingArguments(output_dir=out, report_to=[], max_steps=STEPS, learning_rate=1e-3,
                                                per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                                warmup_steps=1, save_steps=100))
    return m, trainer.train(resume_from_checkpoint=resume)


plain, done = run(os.path.join(work, "plain"))
assert done.global_step == STEPS and not done.metrics["interrupted"]
out = os.path.join(work, "interrupted")
stopped, first = run(out, stop_at=1)
assert first.metrics["interrupted"] and 1 <= first.global_step < STEPS, first
assert os.path.isdir(os.path.join(out, "step-%08d" % first.global_step)), os.listdir(out)
_, second = run(out, resume=True, m=stopped)
assert second.global_step == STEPS, second
for name, t in plain.state_dict().items():
    assert torch.equal(t, stopped.state_dict()[name]), f"{name}: interrupted + resumed differs from a plain run"
print(f"ok: errors name their cause; Ctrl-C stopped after step {first.global_step} with a checkpoint; "
      f"resumed = uninterrupted bit for bit")
