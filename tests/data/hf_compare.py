#!/usr/bin/env python3
"""Test-time oracle: encodes TEXT_FILE with Hugging Face `tokenizers` (the tokenizer given by SPEC, see
hf_common.load) and compares with IDS_FILE (our ids, raw little-endian uint32). Exit 0 when identical;
otherwise prints the first difference and exits 1.
    hf_compare.py SPEC TEXT_FILE IDS_FILE"""
import array
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_common  # noqa: E402


def main():
    spec, text_file, ids_file = sys.argv[1:4]
    text = open(text_file, "rb").read().decode("utf-8")
    hf = hf_common.encode(hf_common.load(spec), text)
    ours = array.array("I")
    ours.frombytes(open(ids_file, "rb").read())
    ours = ours.tolist()
    if hf == ours:
        print(f"hf_compare: {len(hf)} ids identical ({spec}, {text_file})")
        return 0
    n = min(len(hf), len(ours))
    i = next((k for k in range(n) if hf[k] != ours[k]), n)
    print(f"hf_compare: MISMATCH at id {i}: hf {hf[max(0, i - 3):i + 5]} ours {ours[max(0, i - 3):i + 5]} "
          f"(lengths hf {len(hf)} ours {len(ours)})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
