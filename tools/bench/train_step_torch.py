"""The PyTorch peer of bench_train_step: the same GPT-2-124M-shaped model (tied head, tanh GELU,
pre-LayerNorm, learned positions), the same batch, sequence and thread count, one step = forward,
cross-entropy, backward, clip_grad_norm_, AdamW. Prints `torch_step_seconds S` (best of REPS after
one warm-up step) and the CPU seconds of that step.

usage: train_step_torch.py THREADS BATCH SEQ REPS
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

threads, B, T, reps = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)
V, d, L, H, ff, P = 50257, 768, 12, 12, 3072, 1024


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // H)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, d)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(P, d)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT2()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=6e-4)
idx = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))
best, best_cpu = float("inf"), float("inf")
for r in range(reps + 1):
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if r > 0 and dt < best:
        best, best_cpu = dt, dc
print(f"torch_step_seconds {best} cpu {best_cpu}", flush=True)
