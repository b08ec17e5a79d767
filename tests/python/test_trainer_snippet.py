"""The issue's snippet as written (a tiny random model, a small tokenized text dataset, max_steps=1):
it runs, and the weights loaded back into the torch model equal the engine's own export of its final
checkpoint (megatrain-ckpt export) bit for bit; save_model writes the same tensors."""
import os
import subprocess
import tempfile

from tiny import CKPT, assert_same_bits, corpus_ids, read_hf, tiny_llama_dir

import torch
from transformers import AutoModelForCausalLM, TrainingArguments

import megatrain as mt

base = tiny_llama_dir(seed=0)
out_dir = tempfile.mkdtemp(prefix="mt-py-snippet-")
ids = corpus_ids()
my_dataset = [{"input_ids": ids[i:i + 65]} for i in range(0, len(ids) - 65, 65)]

mt.init(max_vram_gb=80)
model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
trainer = mt.Trainer(model=model, train_dataset=my_dataset,
                     args=TrainingArguments(per_device_train_batch_size=1,
                                            gradient_accumulation_steps=128,
                                            output_dir=out_dir, max_steps=1, report_to=[]))
result = trainer.train()

assert result.global_step == 1, result
assert 0 < result.training_loss < 20, result
before = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).state_dict()
changed = [n for n, t in model.state_dict().items() if not torch.equal(t, before[n])]
assert len(changed) >= 10, f"the trained weights were not loaded back: only {changed} changed"

export = os.path.join(out_dir, "engine-export")
subprocess.run([CKPT, "export", out_dir, export], check=True)
assert_same_bits(model.state_dict(), read_hf(export), "weights loaded back vs the engine's export")

saved = os.path.join(out_dir, "saved")
trainer.save_model(saved)
assert_same_bits(model.state_dict(), read_hf(saved), "save_model vs the model")
reloaded = AutoModelForCausalLM.from_pretrained(saved, torch_dtype=torch.float32)
assert_same_bits(reloaded.state_dict(), read_hf(export), "save_model reloaded by transformers")
print("ok: snippet ran 1 step of 128 micro-batches; weights loaded back = the engine's export, bit for bit")

# GPT-2: Conv1D matrices are [in, out] in torch and in files, [out, in] in the engine; a tied head.
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

torch.manual_seed(3)
gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=50257))
gpt2_start = {k: v.clone() for k, v in gpt2.state_dict().items()}
gpt2_out = tempfile.mkdtemp(prefix="mt-py-gpt2-")
mt.Trainer(model=gpt2, train_dataset=my_dataset, max_seq_length=32,
           args=TrainingArguments(output_dir=gpt2_out, per_device_train_batch_size=2, max_steps=2,
                                  report_to=[])).train()
assert not torch.equal(gpt2.state_dict()["transformer.h.0.attn.c_attn.weight"],
                       gpt2_start["transformer.h.0.attn.c_attn.weight"])
gpt2_export = os.path.join(gpt2_out, "engine-export")
subprocess.run([CKPT, "export", gpt2_out, gpt2_export], check=True)
exported = read_hf(gpt2_export)
state = {k: v for k, v in gpt2.state_dict().items() if k in exported}  # buffers (attn.bias), tied lm_head
assert_same_bits(state, exported, "GPT-2 weights loaded back vs the engine's export")
print("ok: GPT-2 (transposed Conv1D, tied head) loaded back = the engine's export, bit for bit")
