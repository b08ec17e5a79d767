#!/usr/bin/env python3
"""Writes tokenizer.json files with each family's post-processor, built by Hugging Face `tokenizers` on
GPT-2's vocabulary (shared gpt2-bpe), for the template tests:
    make_template_tokenizers.py GPT2_DIR OUT_DIR
llama3-style.json   Llama-3: Split (Llama-3 regex) + ByteLevel, ignore_merges, post-processor
                    Sequence [ByteLevel, TemplateProcessing "<|begin_of_text|> $A"]
mistral-style.json  Mistral / Llama-2 (add_bos_token, no add_eos_token): "<s> $A", pair "<s> $A <s> $B"
mistral-eos.json    the same with add_eos_token: "<s> $A </s>"
olmo-style.json     EOS only, the end-of-text token itself: "$A <|endoftext|>"
bert-style.json     BertProcessing; roberta-style.json: RobertaProcessing
Each also holds <|endoftext|> as a special token (the shards' end-of-text separator)."""
import os
import sys

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def base(gpt2_dir, specials, llama3=False):
    bpe = models.BPE.from_file(os.path.join(gpt2_dir, "encoder.json"), os.path.join(gpt2_dir, "vocab.bpe"),
                               ignore_merges=llama3)
    tok = Tokenizer(bpe)
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"] + specials)
    return tok


def template(tok, single, pair, names):
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=[(n, tok.token_to_id(n)) for n in names])


def main():
    gpt2_dir, out = sys.argv[1:3]
    os.makedirs(out, exist_ok=True)
    bot = "<|begin_of_text|>"
    tok = base(gpt2_dir, [bot, "<|end_of_text|>"], llama3=True)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        template(tok, f"{bot} $A", f"{bot} $A {bot}:1 $B:1", [bot])])
    tok.save(os.path.join(out, "llama3-style.json"))
    tok = base(gpt2_dir, ["<unk>", "<s>", "</s>"])
    tok.post_processor = template(tok, "<s> $A", "<s> $A <s>:1 $B:1", ["<s>"])
    tok.save(os.path.join(out, "mistral-style.json"))
    tok.post_processor = template(tok, "<s> $A </s>", "<s> $A </s> <s>:1 $B:1 </s>:1", ["<s>", "</s>"])
    tok.save(os.path.join(out, "mistral-eos.json"))
    tok = base(gpt2_dir, [])
    eot = "<|endoftext|>"
    tok.post_processor = template(tok, f"$A {eot}", f"$A {eot} $B:1 {eot}:1", [eot])
    tok.save(os.path.join(out, "olmo-style.json"))
    tok = base(gpt2_dir, ["<s>", "</s>"])
    tok.post_processor = processors.BertProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    tok.save(os.path.join(out, "bert-style.json"))
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    tok.save(os.path.join(out, "roberta-style.json"))


if __name__ == "__main__":
    main()
