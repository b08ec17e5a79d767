"""Shared by the fixture generator and the test-time comparisons: how Hugging Face `tokenizers` (the
oracle, test-only) is set up for each vocabulary. GPT-2 comes as encoder.json + vocab.bpe with a
ByteLevel pre-tokenizer/decoder and <|endoftext|> as a special token (what GPT-2 is); any other
tokenizer is a tokenizer.json loaded as is. Ids are taken with add_special_tokens=False (the text's ids
alone) unless a caller asks for the post-processor's template."""
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402


def load(spec):
    """spec: a directory with encoder.json + vocab.bpe, a directory with tokenizer.json, or a tokenizer.json."""
    if os.path.isdir(spec) and os.path.exists(os.path.join(spec, "encoder.json")):
        bpe = models.BPE.from_file(os.path.join(spec, "encoder.json"), os.path.join(spec, "vocab.bpe"))
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|endoftext|>"])
        return tok
    if os.path.isdir(spec):
        spec = os.path.join(spec, "tokenizer.json")
    return Tokenizer.from_file(spec)


def encode(tok, text, pair=None, add_special_tokens=False):
    return tok.encode(text, pair, add_special_tokens=add_special_tokens).ids
