"""An outside oracle for megatrain's gpt_oss family, written in PyTorch from transformers'
modeling_gpt_oss.py, integrations/mxfp4.py and modeling_rope_utils.py as of transformers 4.56.2 (the 4.56
line: 4.56.0 and 4.56.2 have the same three files; GptOssForCausalLM with eager attention, the only
attention it supports out of the hub kernels), because the pinned transformers (4.46.3) predates the family.
What it follows, module by module:
  - RMSNorm (GptOssRMSNorm): x * rsqrt(mean(x^2) + eps), times the weight;
  - RoPE (GptOssRotaryEmbedding): inv_freq = 1 / theta^(2i / head_dim), or, when rope_scaling's rope_type
    (or the older "type") is "yarn", _compute_yarn_parameters of 4.56: factor = rope_scaling["factor"] as
    given (4.55 replaced it by max_position_embeddings / original_max_position_embeddings; 4.56 does not),
    attention_factor = rope_scaling["attention_factor"], else get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim) when both are set, else 0.1 ln(factor) + 1 (1 when factor <= 1),
    beta_fast / beta_slow default 32 / 1 (a falsy value too), original_max_position_embeddings defaults to
    max_position_embeddings, truncate defaults to true (floor / ceil of the correction range), the range
    clipped to [0, dim - 1], a linear ramp over dim / 2 (0.001 added to max when min == max); cos and sin of
    position * inv_freq (dim / 2 wide) times attention_factor, applied by _apply_rotary_emb to the two
    halves of each head (x1 cos - x2 sin, x2 cos + x1 sin: rotate_half's math);
  - attention (GptOssAttention + eager_attention_forward): q, k, v projections with biases, RoPE on q and
    k, GQA by repeating the key/value heads, scores * head_dim^-0.5 plus the causal mask (a key at kv is
    visible from q iff kv <= q), and on a "sliding_attention" layer also kv > q - sliding_window; the
    per-head sink logit appended as one more column, the row max subtracted, softmax, the sink column
    dropped, @ v; o_proj with its bias;
  - the MoE block (GptOssMLP): router logits = x W^T + b; top-k of the raw logits; softmax over those k;
    each chosen expert: gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e], gate = gate_up[..., ::2],
    up = gate_up[..., 1::2] (interleaved), gate clamped above at the limit, up to [-limit, limit],
    glu = gate * sigmoid(1.702 gate), out = ((up + 1) glu) @ down_proj[e] + down_proj_bias[e]; y = sum of
    routing weight * out. The limit is config.swiglu_limit (7.0 when absent). NOTE: 4.56's bf16/fp32
    GptOssExperts hard-codes limit = 7.0 and never reads swiglu_limit (only the MXFP4 kernel path,
    Mxfp4GptOssExperts, reads getattr(config, "swiglu_limit", 7.0)); the two agree for every hub
    checkpoint (swiglu_limit 7.0) and this oracle takes the config's value so a test can choose another;
  - the decoder layer: x + attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h)); the head:
    model.norm then lm_head (embed_tokens when tie_word_embeddings);
  - embed_tokens is nn.Embedding(V, D, padding_idx=pad_token_id): when the config sets pad_token_id, that
    row gets no gradient from the lookup (F.embedding's padding_idx; the tied head's gradient still counts).
It loads megatrain's export (DIR/model: config.json + model.safetensors in HF's fused expert layout), runs
the tokens in fp64 (so the oracle's own rounding does not count against megatrain's fp32), writes the
logits, the mean loss over megatrain's targets (cross-entropy, ignore_index -100, no shift: megatrain's
targets are already the next tokens) and every parameter's gradient by megatrain's names (the fused expert
tensors split per expert: experts.{e}.gate_proj.weight [I, D] = gate_up_proj[e][:, 0::2]^T, .gate_proj.bias
= gate_up_proj_bias[e][0::2], up_proj the odd columns, down_proj.weight [D, I] = down_proj[e]^T,
.down_proj.bias = down_proj_bias[e]).

Then the hub's quantized form for a load test: DIR/mxfp4/{config.json, model.safetensors}, the config plus
quantization_config {"quant_method": "mxfp4", "modules_to_not_convert": [...]} as openai/gpt-oss-20b has it,
the tensors as the export's except each layer's gate_up_proj / down_proj replaced by random (fixed numpy
seed) MXFP4 tensors: gate_up_proj_blocks uint8 [E, 2I, D/32, 16], gate_up_proj_scales uint8 [E, 2I, D/32],
down_proj_blocks uint8 [E, D, I/32, 16], down_proj_scales uint8 [E, D, I/32] (scales 120..130); and
DIR/mxfp4_dequant.safetensors: those dequantized, as convert_moe_packed_tensors does (each byte two e2m1
values, the low nibble first, FP4_VALUES = +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} with the sign in bit 3, times
2^(scale - 127); rows [.., G * 32], then transposed to gate_up_proj [E, D, 2I] / down_proj [E, I, D]),
written by megatrain's per-expert names (gate_proj.weight, up_proj.weight, down_proj.weight, float32).

usage: gpt_oss_oracle.py DIR   (DIR/shape.json {"batch", "seq"}, tokens.bin, targets.bin int32)
"""
import json
import math
import os
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
assert cfg["model_type"] == "gpt_oss" and cfg["architectures"] == ["GptOssForCausalLM"]
assert cfg.get("attention_bias", True), "GptOssConfig forces attention_bias = True"
assert cfg.get("partial_rotary_factor", 1.0) == 1.0, "gpt-oss rotates whole heads"
d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or d // H
E, k, ff = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]
eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
layer_types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
assert len(layer_types) == L and set(layer_types) <= {"sliding_attention", "full_attention"}
window = cfg.get("sliding_window")
assert window is not None or "sliding_attention" not in layer_types
limit, alpha = float(cfg.get("swiglu_limit", 7.0)), 1.702
pad = cfg.get("pad_token_id")

weights = load_file(f"{out}/model/model.safetensors")
tied = cfg.get("tie_word_embeddings", False)
if tied:
    weights.pop("lm_head.weight", None)  # tied: lm_head is embed_tokens
P = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in weights.items()}


def rmsnorm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_parameters():
    """(inv_freq fp64 [hd / 2], attention_factor) as 4.56's ROPE_INIT_FUNCTIONS[rope_type](config)."""
    rs = cfg.get("rope_scaling")
    rope_type = "default" if rs is None else rs.get("rope_type", rs.get("type"))
    assert rope_type in ("default", "yarn"), f"rope_scaling {rs}: transformers needs rope_type (or type) 'yarn'"
    dim = hd
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim)
    if rope_type == "default":
        return 1.0 / pos_freqs, 1.0
    factor = rs["factor"]
    attention_factor, mscale, mscale_all_dim = rs.get("attention_factor"), rs.get("mscale"), rs.get("mscale_all_dim")
    original_max = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
    if rs.get("original_max_position_embeddings") and cfg["max_position_embeddings"] / original_max != factor:
        print(f"gpt_oss_oracle: yarn factor {factor} != max_position_embeddings / original "
              f"({cfg['max_position_embeddings']} / {original_max}); 4.56 uses the factor (4.55 used the ratio)",
              file=sys.stderr)

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return inv_freq, attention_factor


inv_freq, attention_factor = rope_parameters()
freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, hd / 2]
cos, sin = (freqs.cos() * attention_factor)[None, None], (freqs.sin() * attention_factor)[None, None]


def rotary(x):
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


q_pos, kv_pos = torch.arange(T)[:, None], torch.arange(T)[None, :]
ninf = torch.tensor(float("-inf"), dtype=torch.float64)
zero = torch.tensor(0.0, dtype=torch.float64)
causal = torch.where(kv_pos <= q_pos, zero, ninf)
sliding = torch.where((kv_pos <= q_pos) & (kv_pos > q_pos - (window or 0)), zero, ninf)


def attention(x, p, mask):
    q = (x @ P[p + "q_proj.weight"].T + P[p + "q_proj.bias"]).view(B, T, H, hd).transpose(1, 2)
    kk = (x @ P[p + "k_proj.weight"].T + P[p + "k_proj.bias"]).view(B, T, Hkv, hd).transpose(1, 2)
    v = (x @ P[p + "v_proj.weight"].T + P[p + "v_proj.bias"]).view(B, T, Hkv, hd).transpose(1, 2)
    q, kk = rotary(q), rotary(kk)
    kk, v = kk.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = q @ kk.transpose(2, 3) * hd ** -0.5 + mask
    sinks = P[p + "sinks"].reshape(1, H, 1, 1).expand(B, H, T, 1)
    combined = torch.cat([scores, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]  # the sink column dropped
    a = probs @ v
    return a.transpose(1, 2).reshape(B, T, H * hd) @ P[p + "o_proj.weight"].T + P[p + "o_proj.bias"]


router_logits = []  # what GptOssForCausalLM records as router_logits: the router's scores (its output 0)


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


def moe(x, p):
    flat = x.reshape(-1, d)
    logits = flat @ P[p + "router.weight"].T + P[p + "router.bias"]
    top, chosen = torch.topk(logits, k, dim=-1)
    w = torch.softmax(top, dim=1)
    router_logits.append(torch.zeros_like(logits).scatter(1, chosen, w))
    gate_up_proj, gate_up_bias = P[p + "experts.gate_up_proj"], P[p + "experts.gate_up_proj_bias"]
    down_proj, down_bias = P[p + "experts.down_proj"], P[p + "experts.down_proj_bias"]
    y = torch.zeros_like(flat)
    for e in range(E):
        rows, slot = torch.where(chosen == e)
        if rows.numel():
            gate_up = flat[rows] @ gate_up_proj[e] + gate_up_bias[e]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=limit)
            up = up.clamp(min=-limit, max=limit)
            glu = gate * torch.sigmoid(gate * alpha)
            o = ((up + 1) * glu) @ down_proj[e] + down_bias[e]
            y = y.index_add(0, rows, w[rows, slot, None] * o)
    return y.view(B, T, d)


embed = P["model.embed_tokens.weight"]
x = F.embedding(tokens, embed, padding_idx=pad if pad is not None and 0 <= pad < embed.shape[0] else None)
for i in range(L):
    p = f"model.layers.{i}."
    mask = sliding if layer_types[i] == "sliding_attention" else causal
    x = x + attention(rmsnorm(x, P[p + "input_layernorm.weight"]), p + "self_attn.", mask)
    x = x + moe(rmsnorm(x, P[p + "post_attention_layernorm.weight"]), p + "mlp.")
head = embed if tied else P["lm_head.weight"]
logits = rmsnorm(x, P["model.norm.weight"]) @ head.T
loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)
if cfg.get("output_router_logits", False):  # GptOssForCausalLM: loss += coef * aux (over the scores)
    loss = loss + cfg["router_aux_loss_coef"] * load_balancing_loss(router_logits)
loss.backward()
logits.detach().numpy().astype(np.float32).tofile(f"{out}/logits.bin")
with open(f"{out}/loss.txt", "w") as f:
    f.write(repr(loss.item()))


def f32(t):
    return t.detach().to(torch.float32).contiguous()


grads = {}
for n, t in P.items():
    g = t.grad if t.grad is not None else torch.zeros_like(t)
    pre, _, leaf = n.rpartition(".experts.")
    if not pre:
        grads[n] = f32(g)
        continue
    for e in range(E):
        q = f"{pre}.experts.{e}."
        if leaf == "gate_up_proj":
            grads[q + "gate_proj.weight"], grads[q + "up_proj.weight"] = f32(g[e][:, 0::2].T), f32(g[e][:, 1::2].T)
        elif leaf == "gate_up_proj_bias":
            grads[q + "gate_proj.bias"], grads[q + "up_proj.bias"] = f32(g[e][0::2]), f32(g[e][1::2])
        elif leaf == "down_proj":
            grads[q + "down_proj.weight"] = f32(g[e].T)
        elif leaf == "down_proj_bias":
            grads[q + "down_proj.bias"] = f32(g[e])
        else:
            raise ValueError(f"unexpected expert tensor {n}")
save_file(grads, f"{out}/grads.safetensors")

# The hub's MXFP4 form (random expert matrices) and its dequantization by megatrain's names.
FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def dequantize(blocks, scales):
    """convert_moe_packed_tensors: blocks [E, R, G, 16] uint8, scales [E, R, G] uint8 -> [E, G * 32, R]."""
    assert blocks.shape[:-1] == scales.shape and blocks.dtype == np.uint8 and scales.dtype == np.uint8
    values = np.empty(blocks.shape[:-1] + (32,), dtype=np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]  # the low nibble first
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values *= np.exp2(scales.astype(np.int32) - 127).astype(np.float32)[..., None]
    e, r, g = scales.shape
    return values.reshape(e, r, g * 32).transpose(0, 2, 1)


assert d % 32 == 0 and ff % 32 == 0, "MXFP4 groups 32 values along the input dimension"
rng = np.random.default_rng(20250805)
quantized = {n: t for n, t in weights.items() if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
dequant = {}
for i in range(L):
    p = f"model.layers.{i}.mlp.experts."
    for proj, rows, cols in (("gate_up_proj", 2 * ff, d), ("down_proj", d, ff)):
        blocks = rng.integers(0, 256, size=(E, rows, cols // 32, 16), dtype=np.uint8)
        scales = rng.integers(120, 131, size=(E, rows, cols // 32), dtype=np.uint8)
        quantized[p + proj + "_blocks"], quantized[p + proj + "_scales"] = torch.from_numpy(blocks), torch.from_numpy(scales)
        w = dequantize(blocks, scales)  # gate_up_proj [E, D, 2I] / down_proj [E, I, D], as transformers uses them
        for e in range(E):
            if proj == "gate_up_proj":
                dequant[f"{p}{e}.gate_proj.weight"] = torch.from_numpy(np.ascontiguousarray(w[e][:, 0::2].T))
                dequant[f"{p}{e}.up_proj.weight"] = torch.from_numpy(np.ascontiguousarray(w[e][:, 1::2].T))
            else:
                dequant[f"{p}{e}.down_proj.weight"] = torch.from_numpy(np.ascontiguousarray(w[e].T))
os.makedirs(f"{out}/mxfp4", exist_ok=True)
save_file({n: t.contiguous() for n, t in quantized.items()}, f"{out}/mxfp4/model.safetensors", metadata={"format": "pt"})
qcfg = dict(cfg)
qcfg["quantization_config"] = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
with open(f"{out}/mxfp4/config.json", "w") as f:
    json.dump(qcfg, f, indent=2)
save_file(dequant, f"{out}/mxfp4_dequant.safetensors")
