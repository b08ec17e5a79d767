"""The outside oracle: builds the same Llama/Qwen2/Qwen3/GPT-2 model as megatrain in PyTorch (plain
torch.nn.functional, written from the Hugging Face modelling code's definitions) from the weights the
C++ test wrote, and writes back logits, the mean loss, every parameter gradient, and the parameters
after one clipped AdamW step.

With "hf_rope_scaling" (a config.json rope_scaling of type linear, dynamic or yarn) the rotary tables
are transformers' own (hf_rope.py, which needs transformers: run it with the venv's python).

usage: torch_oracle.py DIR    (DIR/config.json, params.bin, tokens.bin, targets.bin, grads_in.bin in;
       logits.bin, loss.txt, grads.bin, params_after.bin out)

With "autocast": true in config.json the forward runs under torch.autocast("cpu", dtype=torch.bfloat16)
(fp32 master parameters, bf16 matrix products; the logits are cast to fp32 before the loss, as Hugging
Face's causal LMs do), and the AdamW step uses torch's own gradients (grads_in.bin is not read): the
comparison is of the whole bf16 training step. The same weights and tokens also run without autocast
in the reference precision (fp64; fp32 with "sdpa", where an fp64 attention over T x T scores would
not fit the test's memory): exact_logits.bin, exact_loss.txt, exact_grads.bin, the answer both bf16
sides are judged against (bf16 rounding is ~2^-9, fp32's ~2^-24).
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
out_dir = sys.argv[1]
cfg = json.load(open(f"{out_dir}/config.json"))
B, T = cfg["batch"], cfg["seq"]
V, d = cfg["vocab_size"], cfg["hidden_size"]
H, Hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
eps = cfg["norm_eps"]
gpt2 = cfg["arch"] == "gpt2"

flat = np.fromfile(f"{out_dir}/params.bin", dtype=np.float32)
P = {}
for t in cfg["tensors"]:
    a = flat[t["offset"]:t["offset"] + t["numel"]].reshape(t["shape"])
    P[t["name"]] = torch.tensor(a, dtype=torch.float32, requires_grad=True)
tokens = torch.from_numpy(np.fromfile(f"{out_dir}/tokens.bin", dtype=np.int32).astype(np.int64)).view(B, T)
targets = torch.from_numpy(np.fromfile(f"{out_dir}/targets.bin", dtype=np.int32).astype(np.int64)).view(B, T)


def rmsnorm(x, w):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rope_cos_sin():
    if cfg.get("hf_rope_scaling") is not None:
        # every other rope_scaling type: transformers' own LlamaRotaryEmbedding (hf_rope.py; the venv's
        # python), over this forward's positions 0..T-1 (so dynamic sees T)
        import os
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import hf_rope
        from transformers import LlamaConfig
        config = LlamaConfig(vocab_size=V, hidden_size=d, num_attention_heads=H, num_key_value_heads=Hkv,
                             head_dim=hd, rope_theta=cfg["rope_theta"],
                             max_position_embeddings=cfg["max_position_embeddings"],
                             rope_scaling=cfg["hf_rope_scaling"])
        return hf_rope.cos_sin(config, T)
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = cfg["rope_scaling"]
    if rs["type"] == "llama3":  # transformers' _compute_llama3_parameters
        factor, low, high, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        inv_l = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, inv_l)
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)


def attention(q, k, v):  # q [B, H, T, hd], k/v [B, Hkv, T, hd]
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    if cfg.get("sdpa", False):  # long sequences: torch's own causal attention (no T x T mask built here)
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # Debian's torch 1.13: the same op under its first, private name (returns (out, weights))
            o = F._scaled_dot_product_attention(q, k, v, is_causal=True)[0]
        return o.transpose(1, 2).reshape(B, T, -1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v).transpose(1, 2).reshape(B, T, -1)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def forward(P, dtype=torch.float32):
    if gpt2:
        x = P["transformer.wte.weight"][tokens] + P["transformer.wpe.weight"][torch.arange(T)]
        for i in range(cfg["num_hidden_layers"]):
            p = f"transformer.h.{i}."
            h = F.layer_norm(x, (d,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
            qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
            q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
            x = x + F.linear(attention(q, k, v), P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (d,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
            h = gelu_new(F.linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
            x = x + F.linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
        h = F.layer_norm(x, (d,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
        return F.linear(h, P["transformer.wte.weight"])
    cos, sin = (t.to(dtype) for t in rope_cos_sin())
    x = P["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"])
        q = F.linear(h, P[p + "self_attn.q_proj.weight"], P.get(p + "self_attn.q_proj.bias")).view(B, T, H, hd)
        k = F.linear(h, P[p + "self_attn.k_proj.weight"], P.get(p + "self_attn.k_proj.bias")).view(B, T, Hkv, hd)
        v = F.linear(h, P[p + "self_attn.v_proj.weight"], P.get(p + "self_attn.v_proj.bias")).view(B, T, Hkv, hd)
        if cfg["qk_norm"]:
            q = rmsnorm(q, P[p + "self_attn.q_norm.weight"])
            k = rmsnorm(k, P[p + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        x = x + F.linear(attention(q, k, v), P[p + "self_attn.o_proj.weight"])
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"])
        h = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"])
        x = x + F.linear(h, P[p + "mlp.down_proj.weight"])
    h = rmsnorm(x, P["model.norm.weight"])
    lm = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return F.linear(h, lm)


def write_exact():
    """The step's answer in the reference precision, for judging both bf16 sides."""
    dtype = torch.float32 if cfg.get("sdpa", False) else torch.float64
    P_ref = {n: p.detach().to(dtype).requires_grad_() for n, p in P.items()}
    logits_ref = forward(P_ref, dtype)
    loss_ref = F.cross_entropy(logits_ref.view(-1, V), targets.view(-1), ignore_index=-100)
    loss_ref.backward()
    logits_ref.detach().numpy().astype(np.float32).tofile(f"{out_dir}/exact_logits.bin")
    with open(f"{out_dir}/exact_loss.txt", "w") as f:
        f.write(repr(loss_ref.item()) + " " + str(dtype).replace("torch.", ""))
    names = [t["name"] for t in cfg["tensors"]]
    np.concatenate([P_ref[n].grad.numpy().ravel() for n in names]).astype(np.float32).tofile(
        f"{out_dir}/exact_grads.bin")


autocast = cfg.get("autocast", False)
if autocast:
    write_exact()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forward(P)
    logits = logits.float()
else:
    logits = forward(P)
loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
loss.backward()
logits.detach().numpy().astype(np.float32).tofile(f"{out_dir}/logits.bin")
with open(f"{out_dir}/loss.txt", "w") as f:
    f.write(repr(loss.item()))
names = [t["name"] for t in cfg["tensors"]]
np.concatenate([P[n].grad.numpy().ravel() for n in names]).astype(np.float32).tofile(f"{out_dir}/grads.bin")

# The AdamW step runs on megatrain's gradients (grads_in.bin, mean-loss scale) so that it tests the step
# math alone: some true gradients are exactly zero (a key bias shifts every score of a query equally),
# and Adam would blow both sides' rounding noise there up to +-lr with unrelated signs.
params = [P[n] for n in names]
if not autocast:
    g_in = np.fromfile(f"{out_dir}/grads_in.bin", dtype=np.float32)
    pos = 0
    for n in names:
        k = P[n].numel()
        P[n].grad = torch.tensor(g_in[pos:pos + k].reshape(P[n].shape))
        pos += k
if cfg["max_grad_norm"] > 0:
    torch.nn.utils.clip_grad_norm_(params, cfg["max_grad_norm"])
decay = [P[t["name"]] for t in cfg["tensors"] if t["weight_decay"]]
no_decay = [P[t["name"]] for t in cfg["tensors"] if not t["weight_decay"]]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
opt.step()
np.concatenate([P[n].detach().numpy().ravel() for n in names]).astype(np.float32).tofile(f"{out_dir}/params_after.bin")
