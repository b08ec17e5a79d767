# Loads two Hugging Face model directories and checks that their tensors are equal (exactly, after
# converting the first to the second's dtype) and, with transformers, that both load and their logits
# on a fixed batch agree. Optional: --logits FILE compares against megatrain's logits (raw float32,
# [batch, seq, vocab]) within a relative tolerance.
#   compare_hf_models.py SRC_DIR OUT_DIR [--cast bfloat16] [--logits FILE]
import argparse, glob, json, os, sys
import torch
from safetensors.torch import load_file

p = argparse.ArgumentParser()
p.add_argument("src")
p.add_argument("out")
p.add_argument("--cast", default=None)
p.add_argument("--logits", default=None)
a = p.parse_args()

def tensors(d):
    t = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        t.update(load_file(f))
    return t

src, out = tensors(a.src), tensors(a.out)
cfg = json.load(open(os.path.join(a.src, "config.json")))
tied = cfg.get("tie_word_embeddings", cfg["model_type"] == "gpt2")
if tied:
    src.pop("lm_head.weight", None)
missing = sorted(set(src) - set(out))
extra = sorted(set(out) - set(src))
assert not missing and not extra, f"names differ: missing {missing} extra {extra}"
for n in src:
    want = src[n].to(getattr(torch, a.cast)) if a.cast else src[n].float()
    got = out[n] if a.cast else out[n].float()
    assert want.shape == got.shape, f"{n}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(want, got), f"{n}: values differ, max abs diff {(want.float() - got.float()).abs().max().item()}"
print(f"tensors equal: {len(src)}")
for f in ("tokenizer_config.json", "special_tokens_map.json"):
    assert os.path.exists(os.path.join(a.out, f)), f"tokenizer file {f} not carried along"

if cfg["model_type"] == "qwen3":
    print("qwen3: transformers 4.46 has no Qwen3ForCausalLM; tensors compared only")
    sys.exit(0)

import transformers as T
# The same fixed batch the C++ side uses: token (b, t) = (7 * (8 b + t) + 3) mod vocab.
V = cfg["vocab_size"]
tokens = torch.tensor([[(7 * (8 * b + t) + 3) % V for t in range(8)] for b in range(2)])
def logits(d):
    m = T.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        return m(tokens).logits
ls, lo = logits(a.src), logits(a.out)
if not a.cast:
    assert torch.equal(ls, lo), f"logits differ: {(ls - lo).abs().max().item()}"
print("transformers loads the export; logits", "equal" if not a.cast else "computed")
if a.logits:
    ours = torch.frombuffer(bytearray(open(a.logits, "rb").read()), dtype=torch.float32).reshape(lo.shape)
    rel = ((ours - lo).abs().max() / lo.abs().max()).item()
    print(f"megatrain logits vs transformers: max relative difference {rel:.3g}")
    assert rel < 1e-4, rel
