# Writes a tiny random Hugging Face model directory the way transformers does (venv Python, test only).
#   make_hf_model.py ARCH OUT_DIR [--dtype float32|bfloat16|float16] [--max-shard-size SIZE]
# Qwen3 needs transformers >= 4.51 (the venv pins 4.46.3): its directory is written with safetensors
# directly, with the names and config.json that Qwen3ForCausalLM uses.
import argparse, json, os
import torch

p = argparse.ArgumentParser()
p.add_argument("arch")
p.add_argument("out")
p.add_argument("--dtype", default="float32")
p.add_argument("--max-shard-size", default="5GB")
p.add_argument("--sliding-window", type=int, default=None)  # mistral: every layer's window
a = p.parse_args()
torch.manual_seed(1234)
dtype = getattr(torch, a.dtype)
common = dict(vocab_size=128, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

if a.arch == "qwen3":
    from safetensors.torch import save_file
    os.makedirs(a.out, exist_ok=True)
    head_dim = 32  # deliberately != hidden/heads, as real Qwen3 configs have
    cfg = dict(common, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=head_dim, hidden_act="silu",
               rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, attention_bias=False, attention_dropout=0.0,
               use_sliding_window=False, sliding_window=None, max_window_layers=3, tie_word_embeddings=True,
               initializer_range=0.02, torch_dtype=a.dtype, transformers_version="4.51.0", use_cache=True)
    d, ff, q, kv = 64, 112, 4 * head_dim, 2 * head_dim
    t = {"model.embed_tokens.weight": torch.randn(128, d), "model.norm.weight": 1 + 0.1 * torch.randn(d)}
    for i in range(3):
        pre = f"model.layers.{i}."
        shapes = {"input_layernorm.weight": (d,), "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
                  "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q), "self_attn.q_norm.weight": (head_dim,),
                  "self_attn.k_norm.weight": (head_dim,), "post_attention_layernorm.weight": (d,),
                  "mlp.gate_proj.weight": (ff, d), "mlp.up_proj.weight": (ff, d), "mlp.down_proj.weight": (d, ff)}
        for n, s in shapes.items():
            t[pre + n] = 0.05 * torch.randn(*s)
    save_file({k: v.to(dtype).contiguous() for k, v in t.items()}, os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
else:
    import transformers as T
    if a.arch == "llama":
        cfg = T.LlamaConfig(**common, rope_theta=500000.0, rms_norm_eps=1e-5,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = T.LlamaForCausalLM(cfg)
    elif a.arch == "qwen2":
        cfg = T.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1000000.0)
        model = T.Qwen2ForCausalLM(cfg)
    elif a.arch == "mistral":
        cfg = T.MistralConfig(**common, sliding_window=a.sliding_window, head_dim=24)
        model = T.MistralForCausalLM(cfg)
    elif a.arch == "gpt2":
        cfg = T.GPT2Config(vocab_size=128, n_embd=64, n_layer=3, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2)
        model = T.GPT2LMHeadModel(cfg)
    else:
        raise SystemExit("unknown arch " + a.arch)
    # Norm weights and biases are 1 / 0 after init: randomise everything so a mix-up cannot hide.
    with torch.no_grad():
        for n, prm in model.named_parameters():
            prm.add_(0.05 * torch.randn_like(prm))
    model.to(dtype).save_pretrained(a.out, safe_serialization=True, max_shard_size=a.max_shard_size)
# A tokenizer file or two to be carried along.
json.dump({"model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast"},
          open(os.path.join(a.out, "tokenizer_config.json"), "w"))
json.dump({"bos_token": "<s>"}, open(os.path.join(a.out, "special_tokens_map.json"), "w"))
print("wrote", a.out)
