#!/usr/bin/env python3
"""Test-time oracle: encodes TEXT_FILE with Hugging Face `tokenizers` (the tokenizer given by SPEC, see
hf_common.load) and compares with IDS_FILE (our ids, raw little-endian uint32). Exit 0 when identical;
otherwise prints the first difference and exits 1.
    hf_compare.py SPEC TEXT_FILE IDS_FILE [--pair TEXT_FILE_B] [--add-special-tokens]
--pair encodes the two texts as a pair, tokenizer(a, b); --add-special-tokens applies the post-processor's
template (HF's default; without it the ids are those of add_special_tokens=False)."""
import argparse
import array
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("text_file")
    ap.add_argument("ids_file")
    ap.add_argument("--pair")
    ap.add_argument("--add-special-tokens", action="store_true")
    a = ap.parse_args()
    read = lambda p: open(p, "rb").read().decode("utf-8")  # noqa: E731
    hf = hf_common.encode(hf_common.load(a.spec), read(a.text_file), read(a.pair) if a.pair else None,
                          a.add_special_tokens)
    ours = array.array("I")
    ours.frombytes(open(a.ids_file, "rb").read())
    ours = ours.tolist()
    what = f"{a.spec}, {a.text_file}" + (f" + {a.pair}" if a.pair else "") + (
        ", add_special_tokens=True" if a.add_special_tokens else "")
    if hf == ours:
        print(f"hf_compare: {len(hf)} ids identical ({what})")
        return 0
    n = min(len(hf), len(ours))
    i = next((k for k in range(n) if hf[k] != ours[k]), n)
    print(f"hf_compare: MISMATCH at id {i}: hf {hf[max(0, i - 3):i + 5]} ours {ours[max(0, i - 3):i + 5]} "
          f"(lengths hf {len(hf)} ours {len(ours)}; {what})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
