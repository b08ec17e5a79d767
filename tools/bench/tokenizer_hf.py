#!/usr/bin/env python3
"""The Hugging Face `tokenizers` side of `tools/bench/run tokenizer`: encodes TEXT_FILE on one thread
with the given vocabulary (a GPT-2 encoder.json + vocab.bpe directory, or a tokenizer.json) and prints one
JSON line: {"seconds_cold", "seconds", "bytes", "tokens"} (seconds: best of REPS after the cold run).
    tokenizer_hf.py SPEC TEXT_FILE [REPS]"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402


def load(spec):
    if os.path.isdir(spec):
        bpe = models.BPE.from_file(os.path.join(spec, "encoder.json"), os.path.join(spec, "vocab.bpe"))
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|endoftext|>"])
        return tok
    return Tokenizer.from_file(spec)


def main():
    spec, path = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    text = open(path, "rb").read().decode("utf-8")
    tok = load(spec)
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    cold = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        tok.encode(text, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"seconds_cold": cold, "seconds": best, "bytes": len(text.encode("utf-8")), "tokens": len(ids)}))


if __name__ == "__main__":
    main()
