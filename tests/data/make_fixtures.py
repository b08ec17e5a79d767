#!/usr/bin/env python3
"""Generates tests/data/fixtures/hf_ids.json.gz: the token ids Hugging Face `tokenizers` 0.20.3 gives for
the hard strings below and for the first PREFIX bytes of each shared corpus, with the GPT-2 vocabulary and
the Qwen3 tokenizer.json. Run once with the test venv:
    .venv/bin/python3 tests/data/make_fixtures.py
The C++ tests compare our ids with these. (The full corpora are compared at test time by hf_compare.py.)"""
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_common  # noqa: E402
import tokenizers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data"))
PREFIX = 100_000  # bytes of each corpus (cut back to a line end)

HARD = [
    "", " ", "   ", "\n", "\n\n\n", "\t\t x", "a  b   c    d", "end   ", "   start", " \n \n ",
    "line1\nline2\r\nline3\r\n\r\n", "x \t\n y", "Hello world", "Hello, World!",
    "I'm, you're, he'll, she'd, we've, it's, don't", "I'M YOU'RE HE'LL SHE'D WE'VE IT'S DON'T It'S",
    "'s 't 're 've 'm 'll 'd", "rock 'n' roll '' ' '", "1234567890", "3.14159 1,000,000 2026-11-29 0x1F 1e-9",
    "12 123 1234 12345 123456", "naïve café résumé façade", "Ελληνικά κείμενα", "Русский текст, ёжик",
    "中文字符测试，标点。", "日本語のテキストです", "한국어 문장입니다", "עברית", "العربية", "हिन्दी पाठ",
    "😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪", "emoji😀inside words😀", "\u00a0nbsp\u00a0 \u2003em\u3000ideo",
    "x\u0085y \u2028 z\u2029", "zero\u200bwidth", "tab\tseparated\tvalues", "!!!???...---***",
    "\"quoted\" (paren) [bracket] {brace} <angle>", "C++ && || -> => :: ;;", "Mr. Darcy's estate—£10,000 a year!",
    "<|endoftext|>", "Hello<|endoftext|>world", "a <|endoftext|> b", "<|endoftext|><|endoftext|>",
    "<|endoftext", "<|im_start|>user\nhi there<|im_end|>\n", "<think>\nhmm\n</think>\n\nanswer",
    "<|fim_prefix|>def f():<|fim_suffix|>", " " * 100, "a" * 300, "9" * 50, "ab" * 80, "\n" * 20 + "x",
    "mixed CASE and MiXeD wOrDs", "snake_case_name camelCaseName kebab-case-name", "http://example.com/a?b=c&d=e#f",
    "e\u0301 combining acute (not NFC)", "Å vs A\u030a", "ﬁ ligature ﬂ", "½ ² Ⅻ ٣ ௫", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
]


def prefix(path):
    data = open(path, "rb").read()[:PREFIX]
    cut = data.rfind(b"\n")
    return data[: cut + 1].decode("utf-8")


def main():
    out = {"tokenizers_version": tokenizers.__version__, "hard": HARD, "prefix_bytes": PREFIX, "ids": {}}
    corpora = {"austen": prefix(os.path.join(SHARED, "corpus", "austen.txt")),
               "mobydick": prefix(os.path.join(SHARED, "corpus", "mobydick.txt"))}
    specs = {"gpt2": os.path.join(SHARED, "gpt2-bpe"), "qwen3": os.path.join(SHARED, "qwen3-tokenizer")}
    for name, spec in specs.items():
        tok = hf_common.load(spec)
        ids = {"hard": [hf_common.encode(tok, s) for s in HARD]}
        for cname, text in corpora.items():
            ids[cname] = hf_common.encode(tok, text)
        out["ids"][name] = ids
    os.makedirs(os.path.join(HERE, "fixtures"), exist_ok=True)
    path = os.path.join(HERE, "fixtures", "hf_ids.json.gz")
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
