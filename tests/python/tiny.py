"""Shared pieces of the Python tests: tiny random transformers models, token data from the shared
corpus, and reading a Hugging Face directory's safetensors."""
import glob
import os
import sys
import tempfile

SHARED = os.environ.get("MEGATRAIN_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../../../shared/data"))
if not os.path.isfile(os.path.join(SHARED, "gpt2-bpe", "vocab.bpe")):
    print(f"skipped: the shared data ({SHARED}/gpt2-bpe) is missing")
    sys.exit(77)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import megatrain as mt  # noqa: E402

torch.set_num_threads(1)
BINARY = os.environ.get("MEGATRAIN_BINARY", "")
CKPT = os.environ.get("MEGATRAIN_CKPT", "")


def tiny_llama_dir(seed=0):
    """A random 2-layer Llama saved with save_pretrained (GPT-2's vocabulary); returns the directory."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=50257, max_position_embeddings=64)
    d = tempfile.mkdtemp(prefix="mt-py-model-")
    LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d


def corpus_ids(chars=20000):
    """GPT-2 token ids of the start of a novel in the shared corpus (the engine's tokenizer)."""
    tok = mt.Tokenizer.load(os.path.join(SHARED, "gpt2-bpe"))
    with open(os.path.join(SHARED, "corpus", "austen.txt")) as f:
        return tok.encode(f.read()[:chars]).tolist()


def read_hf(directory):
    """{name: tensor} of every safetensors file in a Hugging Face directory."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        out.update(load_file(path))
    assert out, f"no safetensors in {directory}"
    return out


def assert_same_bits(state, tensors, what):
    """Every tensor of the export equals the model's, bit for bit, and the model has no other parameter."""
    params = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    assert set(params) == set(tensors), f"{what}: names differ: {set(params) ^ set(tensors)}"
    for name, t in tensors.items():
        a = params[name].detach().contiguous().view(torch.int32)
        b = t.contiguous().view(torch.int32)
        assert torch.equal(a, b), f"{what}: {name} differs (max |diff| {(params[name] - t).abs().max().item()})"
