"""transformers' own RoPE parameters and tables for a config.json (the oracle of the rope_scaling types).

As a module: rope_parameters(config, seq_len) -> (inv_freq fp32 tensor [head_dim/2], attention_scaling)
and cos_sin(config, seq_len) -> fp32 (cos, sin) [seq_len, head_dim] as LlamaRotaryEmbedding.forward
returns them for positions 0..seq_len-1. Needs transformers (the venv's python).

- default, linear, llama3, yarn (with 4.46's keys): ROPE_INIT_FUNCTIONS[rope_type] of the installed
  transformers (4.46.3), through LlamaRotaryEmbedding itself.
- dynamic: LlamaRotaryEmbedding's own _dynamic_frequency_update runs in forward, with seq_len =
  max(position_ids) + 1 a 0-d int64 tensor (so the grown base is computed in fp32 tensors).
- yarn with a key newer than 4.46 (original_max_position_embeddings, mscale, mscale_all_dim, truncate):
  4.46.3 warns "Unrecognized keys" and ignores them, so newer_yarn below is a transcription of newer
  transformers' _compute_yarn_parameters (the version that added truncate for gpt-oss), line for line.

As a script: hf_rope.py DIR SEQ [DIR SEQ ...]: for each DIR/config.json (loaded with AutoConfig, i.e. as
transformers loads an exported model) writes DIR/inv_freq.bin, DIR/cos.bin, DIR/sin.bin (fp32) and
DIR/pow.bin (torch's rope_theta ** (2i / dim)) and DIR/rope.json ({"attention_scaling": ..., "rope_scaling": what transformers read}).
"""
import json
import math
import sys

import numpy as np
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

NEWER_YARN_KEYS = {"original_max_position_embeddings", "mscale", "mscale_all_dim", "truncate"}


def rope_type(config):
    rs = config.rope_scaling or {}
    return rs.get("rope_type", rs.get("type", "default"))


def newer_yarn(config, device=None):
    base = config.rope_theta
    partial_rotary_factor = config.partial_rotary_factor if hasattr(config, "partial_rotary_factor") else 1.0
    head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    dim = int(head_dim * partial_rotary_factor)
    factor = config.rope_scaling["factor"]
    attention_factor = config.rope_scaling.get("attention_factor")
    mscale = config.rope_scaling.get("mscale")
    mscale_all_dim = config.rope_scaling.get("mscale_all_dim")

    # DeepSeek-V3 and gpt-oss carry the pretrained length here; the factor is then the ratio of the two.
    if "original_max_position_embeddings" in config.rope_scaling:
        original_max_position_embeddings = config.rope_scaling["original_max_position_embeddings"]
        factor = config.max_position_embeddings / original_max_position_embeddings
    else:
        original_max_position_embeddings = config.max_position_embeddings

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    beta_fast = config.rope_scaling.get("beta_fast") or 32
    beta_slow = config.rope_scaling.get("beta_slow") or 1

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate):
        low = find_correction_dim(low_rot, dim, base, max_position_embeddings)
        high = find_correction_dim(high_rot, dim, base, max_position_embeddings)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001  # Prevent singularity
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    truncate = config.rope_scaling.get("truncate", True)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2).to(device=device, dtype=torch.float)
    inv_freq = (
        inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
        + inv_freq_extrapolation * inv_freq_extrapolation_factor
    )
    return inv_freq, attention_factor


def rotary(config, seq_len):
    """LlamaRotaryEmbedding run once over positions 0..seq_len-1: (module, cos, sin)."""
    emb = LlamaRotaryEmbedding(config=config)
    if rope_type(config) == "yarn" and NEWER_YARN_KEYS & set(config.rope_scaling):
        inv_freq, emb.attention_scaling = newer_yarn(config)
        emb.register_buffer("inv_freq", inv_freq, persistent=False)
    x = torch.zeros(1, seq_len, 1, dtype=torch.float32)
    position_ids = torch.arange(seq_len, dtype=torch.int64)[None, :]
    with torch.no_grad():
        cos, sin = emb(x, position_ids)
    return emb, cos[0], sin[0]


def rope_parameters(config, seq_len):
    emb, _, _ = rotary(config, seq_len)
    return emb.inv_freq.float(), emb.attention_scaling


def cos_sin(config, seq_len):
    _, cos, sin = rotary(config, seq_len)
    return cos, sin


def main(args):
    for d, t in zip(args[0::2], args[1::2]):
        config = AutoConfig.from_pretrained(d)
        emb, cos, sin = rotary(config, int(t))
        assert emb.inv_freq.dtype == torch.float32
        emb.inv_freq.numpy().astype(np.float32).tofile(f"{d}/inv_freq.bin")
        cos.numpy().astype(np.float32).tofile(f"{d}/cos.bin")
        sin.numpy().astype(np.float32).tofile(f"{d}/sin.bin")
        # torch's own fp32 pow of the plain frequencies (its pow and glibc's powf round differently on
        # some arguments: the test tells those apart from a formula that differs)
        dim = emb.inv_freq.numel() * 2
        pow_ = config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        pow_.numpy().astype(np.float32).tofile(f"{d}/pow.bin")
        with open(f"{d}/rope.json", "w") as f:
            json.dump({"attention_scaling": float(emb.attention_scaling), "rope_scaling": config.rope_scaling,
                       "rope_type": emb.rope_type}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1:])
