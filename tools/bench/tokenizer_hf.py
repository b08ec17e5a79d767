#!/usr/bin/env python3
"""The Hugging Face `tokenizers` side of `tools/bench/run tokenizer`: encodes TEXT_FILE on one thread
with the given vocabulary (a GPT-2 encoder.json + vocab.bpe directory, or a tokenizer.json) and prints one
JSON line: {"seconds_cold", "seconds", "bytes", "tokens", "documents", "cache_capacity"} (seconds: best of
REPS after the cold run). CACHE: the BPE word cache's capacity (GPT-2 directory only; 0 = the library's
default, 10,000 words; ours holds 65,536). MODE: "documents" (the text cut after every blank line, the
pieces encoded with encode_batch, as a datasets.map would feed them; the C++ side cuts the same way) or
"whole" (the text as one string).
    tokenizer_hf.py SPEC TEXT_FILE [REPS] [CACHE] [MODE]"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402


def load(spec, cache):
    if os.path.isdir(spec):
        kwargs = {"cache_capacity": cache} if cache > 0 else {}
        bpe = models.BPE.from_file(os.path.join(spec, "encoder.json"), os.path.join(spec, "vocab.bpe"), **kwargs)
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|endoftext|>"])
        return tok
    return Tokenizer.from_file(spec)


def documents(text):
    """The text cut right after every blank line ("\\n\\n"); the pieces concatenate to the text."""
    docs, start = [], 0
    while True:
        cut = text.find("\n\n", start)
        if cut < 0:
            break
        docs.append(text[start:cut + 2])
        start = cut + 2
    if start < len(text):
        docs.append(text[start:])
    return docs


def main():
    spec, path = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    cache = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    mode = sys.argv[5] if len(sys.argv) > 5 else "documents"
    if mode not in ("documents", "whole"):
        sys.exit("tokenizer_hf.py: MODE is documents or whole, not " + mode)
    if cache > 0 and not os.path.isdir(spec):
        sys.exit("tokenizer_hf.py: a cache capacity applies to a GPT-2 directory only")
    text = open(path, "rb").read().decode("utf-8")
    tok = load(spec, cache)
    docs = documents(text) if mode == "documents" else [text]

    def encode():
        return tok.encode_batch(docs, add_special_tokens=False)

    t0 = time.perf_counter()
    tokens = sum(len(e.ids) for e in encode())
    cold = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        encode()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"seconds_cold": cold, "seconds": best, "bytes": len(text.encode("utf-8")), "tokens": tokens,
                      "documents": len(docs), "cache_capacity": cache if cache > 0 else 10000}))


if __name__ == "__main__":
    main()
