"""transformers' own model as the oracle of data.packing = documents (run with the venv's python:
transformers 4.46.3, AutoModelForCausalLM, eager attention, fp32, eval mode: no dropout).

megatrain's packed window holds several documents a row; transformers runs each document (each piece of
one cut by a window's start) ALONE, with positions from 0, and its logits meet that piece's targets
(already the next tokens: no shift; -100 at a document's last token and on a masked prompt). The loss is
the sum over every target of every piece divided by their count (transformers >= 4.46's
num_items_in_batch mean); autograd gives every parameter's gradient.

usage: hf_documents_oracle.py DIR   (DIR/model: megatrain's export; DIR/shape.json {"batch", "seq"};
       tokens.bin, targets.bin, positions.bin int32 [batch, seq]). Writes logits.bin (fp32 [batch, seq,
       vocab], each piece's own), loss.txt and grads.safetensors (by transformers' parameter names).
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
out = sys.argv[1]
shape = json.load(open(f"{out}/shape.json"))
B, T = shape["batch"], shape["seq"]


def read(name):
    return torch.from_numpy(np.fromfile(f"{out}/{name}", dtype=np.int32).astype(np.int64)).view(B, T)


tokens, targets, positions = read("tokens.bin"), read("targets.bin"), read("positions.bin")
model = AutoModelForCausalLM.from_pretrained(f"{out}/model", torch_dtype=torch.float32, attn_implementation="eager")
model.eval()
loss_sum = torch.zeros((), dtype=torch.float32)
logits_all = None
pieces = 0
for b in range(B):
    starts = [t for t in range(T) if positions[b, t].item() == 0] + [T]
    for s, e in zip(starts, starts[1:]):
        logits = model(input_ids=tokens[b:b + 1, s:e], use_cache=False).logits[0]
        if logits_all is None:
            logits_all = torch.zeros(B, T, logits.shape[-1])
        logits_all[b, s:e] = logits.detach()
        loss_sum = loss_sum + F.cross_entropy(logits, targets[b, s:e], ignore_index=-100, reduction="sum")
        pieces += 1
count = int((targets != -100).sum())
loss = loss_sum / count
loss.backward()
logits_all.numpy().astype(np.float32).tofile(f"{out}/logits.bin")
with open(f"{out}/loss.txt", "w") as f:
    f.write(repr(loss.item()))
with open(f"{out}/pieces.txt", "w") as f:
    f.write(str(pieces))
save_file({n: p.grad.detach().contiguous() for n, p in model.named_parameters() if p.grad is not None},
          f"{out}/grads.safetensors")
