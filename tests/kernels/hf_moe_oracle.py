"""transformers' own Mixtral as the oracle for megatrain's mixtral family (run with the venv's python:
transformers 4.46.3, MixtralForCausalLM, eager attention, fp32).

It loads the model directory megatrain exported (DIR/model: config.json + safetensors with v4's
per-expert names), runs the tokens, and writes the logits, the mean loss over megatrain's targets
(F.cross_entropy with ignore_index -100, no shift: the targets are already the next tokens) and every
parameter's gradient by name (DIR/grads.safetensors). It then writes the same weights in transformers
v5's fused expert layout (DIR/fused: mlp.experts.gate_up_proj [E, 2 ff, d] with the gate first,
mlp.experts.down_proj [E, d, ff], the router mlp.gate.weight) for megatrain's import test.

usage: hf_moe_oracle.py DIR   (DIR/shape.json {"batch", "seq"}, tokens.bin, targets.bin int32)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import MixtralForCausalLM

torch.set_num_threads(1)
out = sys.argv[1]
shape = json.load(open(f"{out}/shape.json"))
B, T = shape["batch"], shape["seq"]
tokens = torch.from_numpy(np.fromfile(f"{out}/tokens.bin", dtype=np.int32).astype(np.int64)).view(B, T)
targets = torch.from_numpy(np.fromfile(f"{out}/targets.bin", dtype=np.int32).astype(np.int64)).view(B, T)

model = MixtralForCausalLM.from_pretrained(f"{out}/model", torch_dtype=torch.float32, attn_implementation="eager")
model.train()  # no dropout is configured; router_jitter_noise is 0
out_model = model(input_ids=tokens)
logits = out_model.logits
loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)
if model.config.output_router_logits:  # transformers' own load-balancing loss, as MixtralForCausalLM adds it
    loss = loss + model.config.router_aux_loss_coef * out_model.aux_loss
loss.backward()
logits.detach().numpy().astype(np.float32).tofile(f"{out}/logits.bin")
with open(f"{out}/loss.txt", "w") as f:
    f.write(repr(loss.item()))
save_file({n: p.grad.detach().contiguous() for n, p in model.named_parameters()}, f"{out}/grads.safetensors")

# The v5 layout of the same weights.
cfg = model.config
fused = {}
for n, p in model.state_dict().items():
    if ".block_sparse_moe." not in n:
        fused[n] = p.contiguous()
for i in range(cfg.num_hidden_layers):
    old = f"model.layers.{i}.block_sparse_moe."
    new = f"model.layers.{i}.mlp."
    sd = model.state_dict()
    E = cfg.num_local_experts
    fused[new + "gate.weight"] = sd[old + "gate.weight"].contiguous()
    fused[new + "experts.gate_up_proj"] = torch.stack(
        [torch.cat([sd[old + f"experts.{e}.w1.weight"], sd[old + f"experts.{e}.w3.weight"]], 0) for e in range(E)])
    fused[new + "experts.down_proj"] = torch.stack([sd[old + f"experts.{e}.w2.weight"] for e in range(E)])
os.makedirs(f"{out}/fused", exist_ok=True)
save_file(fused, f"{out}/fused/model.safetensors", metadata={"format": "pt"})
shutil.copy(f"{out}/model/config.json", f"{out}/fused/config.json")
