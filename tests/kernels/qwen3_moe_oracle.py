"""An outside oracle for megatrain's qwen3_moe family, written in PyTorch from transformers'
modeling_qwen3_moe.py (the 4.5x line, as of transformers 4.56: Qwen3MoeForCausalLM with eager attention,
Qwen3MoeSparseMoeBlock, Qwen3MoeMLP, Qwen3MoeRMSNorm) because the pinned transformers (4.46.3) predates
the family. What it follows, module by module:
  - RMSNorm: x in fp32, x * rsqrt(mean(x^2) + eps), times the weight;
  - attention: q = q_norm(q_proj(x) viewed per head), k = k_norm(k_proj(x) per head), v = v_proj(x); RoPE
    (rotate_half, inv_freq = 1 / theta^(2i / head_dim)) on q and k after their norms; GQA by repeating the
    key/value heads; causal softmax in fp32 at scale head_dim^-0.5; o_proj;
  - the decoder layer: x + attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h)), where the
    MLP is the sparse block when (layer not in mlp_only_layers) and num_experts > 0 and
    (layer + 1) % decoder_sparse_step == 0, else a dense SwiGLU of width intermediate_size;
  - the sparse block: router logits = gate(x); softmax over experts in fp32; top-k; divided by their sum
    only when norm_topk_prob; y = sum_j w_j down_e(silu(gate_e(x)) * up_e(x)).
It loads megatrain's export (DIR/model: config.json + safetensors with per-expert names), runs the tokens
in fp64 (so the oracle's own rounding does not count against megatrain's fp32), writes the logits, the
mean loss over megatrain's targets (cross-entropy, ignore_index -100, no shift) and every parameter's
gradient by name; then the same weights in transformers v5's fused expert layout (DIR/fused:
mlp.experts.gate_up_proj [E, 2 ff, d] with the gate first, mlp.experts.down_proj [E, d, ff]).

usage: qwen3_moe_oracle.py DIR   (DIR/shape.json {"batch", "seq"}, tokens.bin, targets.bin int32)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)
out = sys.argv[1]
shape = json.load(open(f"{out}/shape.json"))
B, T = shape["batch"], shape["seq"]
tokens = torch.from_numpy(np.fromfile(f"{out}/tokens.bin", dtype=np.int32).astype(np.int64)).view(B, T)
targets = torch.from_numpy(np.fromfile(f"{out}/targets.bin", dtype=np.int32).astype(np.int64)).view(B, T)

cfg = json.load(open(f"{out}/model/config.json"))
assert cfg["model_type"] == "qwen3_moe" and cfg["architectures"] == ["Qwen3MoeForCausalLM"]
assert not cfg.get("attention_bias", False) and not cfg.get("use_sliding_window", False)
assert cfg.get("rope_scaling") is None
d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or d // H
E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
mlp_only = set(cfg.get("mlp_only_layers") or [])
step = cfg.get("decoder_sparse_step", 1)

weights = load_file(f"{out}/model/model.safetensors")
P = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in weights.items()}


def rmsnorm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float64) / hd))
freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
emb = torch.cat((freqs, freqs), dim=-1)
cos, sin = emb.cos()[None, None], emb.sin()[None, None]
causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)


def attention(x, p):
    q = rmsnorm((x @ P[p + "q_proj.weight"].T).view(B, T, H, hd), P[p + "q_norm.weight"]).transpose(1, 2)
    kk = rmsnorm((x @ P[p + "k_proj.weight"].T).view(B, T, Hkv, hd), P[p + "k_norm.weight"]).transpose(1, 2)
    v = (x @ P[p + "v_proj.weight"].T).view(B, T, Hkv, hd).transpose(1, 2)
    q, kk = q * cos + rotate_half(q) * sin, kk * cos + rotate_half(kk) * sin
    kk, v = kk.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    a = torch.softmax(q @ kk.transpose(2, 3) * hd ** -0.5 + causal, dim=-1) @ v
    return a.transpose(1, 2).reshape(B, T, H * hd) @ P[p + "o_proj.weight"].T


def swiglu_mlp(x, p):
    return (F.silu(x @ P[p + "gate_proj.weight"].T) * (x @ P[p + "up_proj.weight"].T)) @ P[p + "down_proj.weight"].T


router_logits = []  # every MoE layer's, for the load-balancing loss (output_router_logits)


def load_balancing_loss(gate_logits):
    """transformers' load_balancing_loss_func without an attention mask: the router outputs of every MoE
    layer concatenated, softmax, the top-k as a one-hot (no gradient), E * sum(tokens_per_expert *
    router_prob_per_expert)."""
    cat = torch.cat(gate_logits, dim=0)
    routing_weights = torch.softmax(cat, dim=-1)
    _, selected = torch.topk(routing_weights, k, dim=-1)
    expert_mask = F.one_hot(selected, E)
    tokens_per_expert = torch.mean(expert_mask.to(routing_weights.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E


def sparse_block(x, p):
    flat = x.view(-1, d)
    gate_logits = flat @ P[p + "gate.weight"].T
    router_logits.append(gate_logits)
    probs = torch.softmax(gate_logits, dim=-1)
    w, chosen = torch.topk(probs, k, dim=-1)
    if cfg.get("norm_topk_prob", False):
        w = w / w.sum(dim=-1, keepdim=True)
    y = torch.zeros_like(flat)
    for e in range(E):
        rows, slot = torch.where(chosen == e)
        if rows.numel():
            y = y.index_add(0, rows, w[rows, slot, None] * swiglu_mlp(flat[rows], f"{p}experts.{e}."))
    return y.view(B, T, d)


x = P["model.embed_tokens.weight"][tokens]
for i in range(L):
    p = f"model.layers.{i}."
    x = x + attention(rmsnorm(x, P[p + "input_layernorm.weight"]), p + "self_attn.")
    h = rmsnorm(x, P[p + "post_attention_layernorm.weight"])
    moe = i not in mlp_only and E > 0 and (i + 1) % step == 0
    x = x + (sparse_block(h, p + "mlp.") if moe else swiglu_mlp(h, p + "mlp."))
head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else P["lm_head.weight"]
logits = rmsnorm(x, P["model.norm.weight"]) @ head.T
loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)
if cfg.get("output_router_logits", False):  # Qwen3MoeForCausalLM: loss += coef * aux
    loss = loss + cfg["router_aux_loss_coef"] * load_balancing_loss(router_logits)
loss.backward()
logits.detach().numpy().astype(np.float32).tofile(f"{out}/logits.bin")
with open(f"{out}/loss.txt", "w") as f:
    f.write(repr(loss.item()))
save_file({n: t.grad.to(torch.float32).contiguous() for n, t in P.items()}, f"{out}/grads.safetensors")

# The v5 layout of the same weights: each layer's experts fused.
fused = {n: t for n, t in weights.items() if ".mlp.experts." not in n}
for i in range(L):
    p = f"model.layers.{i}.mlp.experts."
    if f"{p}0.gate_proj.weight" not in weights:
        continue  # a dense layer
    fused[p + "gate_up_proj"] = torch.stack(
        [torch.cat([weights[f"{p}{e}.gate_proj.weight"], weights[f"{p}{e}.up_proj.weight"]], 0) for e in range(E)])
    fused[p + "down_proj"] = torch.stack([weights[f"{p}{e}.down_proj.weight"] for e in range(E)])
os.makedirs(f"{out}/fused", exist_ok=True)
save_file(fused, f"{out}/fused/model.safetensors", metadata={"format": "pt"})
shutil.copy(f"{out}/model/config.json", f"{out}/fused/config.json")
