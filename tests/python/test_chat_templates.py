"""Chat records: megatrain-data's role templates against transformers' apply_chat_template, and the loss mask.

For each built-in template (data/chat_templates/): the text `megatrain-data render-chat` renders equals,
byte for byte, what transformers renders with that family's tokenizer_config.json chat_template (Qwen3's
real file from the shared data; Llama-3's and Mistral's written here from their published templates);
`megatrain-data shards --format chat` writes the ids of apply_chat_template(tokenize=True), the same ids and
mask as the front door (megatrain.data on a Hugging Face tokenizer), and the masked-in tokens spell exactly
the assistant turns (content and end token). Bad records and templates: exit 1 with the file, line and
field named, and no shard left behind; the front door raises ConfigError for the same records.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tiny import SHARED

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import megatrain as mt
from megatrain import data as mt_data

TOOL = os.environ.get("MEGATRAIN_DATA_TOOL", "")
if not os.path.isfile(TOOL):
    print("skipped: MEGATRAIN_DATA_TOOL (megatrain-data) is not set")
    sys.exit(77)
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "chat_templates")
work = tempfile.mkdtemp(prefix="mt-py-chat-")

# Published chat templates (tokenizer_config.json "chat_template"), never downloaded at run time:
# Llama-3: meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json on the Hugging Face hub (the string as
#   quoted verbatim in public code that pins it, found with a code search).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Mistral: mistralai/Mistral-7B-Instruct-v0.2's tokenizer_config.json (the same string is in its GGUF
#   conversion's metadata, quoted in public code).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def run_tool(*args, ok=True):
    p = subprocess.run([TOOL, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(f"megatrain-data {' '.join(args)}: {p.stderr}")
    return p


def small_tokenizer(name, pattern, specials, bos, eos, template):
    """A byte-level BPE tokenizer trained on the shared corpus with the family's special tokens, and the
    tokenizer_config.json that carries the family's published chat template."""
    d = os.path.join(work, name)
    os.makedirs(d)
    corpus = os.path.join(d, "corpus.txt")
    with open(os.path.join(SHARED, "corpus", "austen.txt")) as f, open(corpus, "w") as out:
        out.write(f.read()[:300000])
    run_tool("train-tokenizer", "--out", os.path.join(d, "tokenizer.json"), "--vocab-size", "2000", "--pattern",
             pattern, *sum([["--special", s] for s in specials], []), corpus)
    os.remove(corpus)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
                   "chat_template": template}, f)
    return d


qwen3 = os.path.join(work, "qwen3")
shutil.copytree(os.path.join(SHARED, "qwen3-tokenizer"), qwen3)
families = {
    "qwen3": qwen3,
    "llama3": small_tokenizer("llama3", "llama3", ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>",
                                                    "<|end_header_id|>", "<|eot_id|>"],
                              "<|begin_of_text|>", "<|eot_id|>", LLAMA3_TEMPLATE),
    "mistral": small_tokenizer("mistral", "gpt2", ["</s>", "<s>"], "<s>", "</s>", MISTRAL_TEMPLATE),
}

S, U, A = "system", "user", "assistant"


def conv(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


# Records that exercise each template's details: surrounding whitespace (Llama-3 trims with Python's
# str.strip(), Unicode spaces included), leading newlines of Qwen3's final turn, an empty answer, a
# conversation that ends with a prompt, non-ASCII text.
common = [
    conv((U, "What is the capital of France?"), (A, "Paris.")),
    conv((U, "  Tell me a story.\n"), (A, "\n\nOnce upon a time, Elizabeth walked.\n"), (U, "More?"),
         (A, "\u00a0She met Mr. Darcy.\u3000")),
    conv((U, "Say nothing."), (A, "")),
    conv((U, "Caf\u00e9 \u2014 na\u00efve \U0001F600"), (A, "Oui, tr\u00e8s \u00e9l\u00e9gant."), (U, "Merci")),
]
records = {
    "qwen3": common + [conv((S, "You are terse."), (U, "Hi"), (A, " Hello! "), (U, "Again"), (A, "\nBye")),
                       conv((S, "Only a system prompt and an answer."), (A, "Fine."))],
    "llama3": common + [conv((S, "  You are terse. "), (U, "Hi"), (A, "Hello!"), (U, "Again"), (A, "Bye"))],
    "mistral": common,
}
# records[...][-1] for qwen3 starts with a system turn, then an assistant turn: rendered without a think block.
records["qwen3"][-1]["messages"].insert(1, {"role": U, "content": "Answer."})


def expected_trained(family, messages):
    """The text of the trained tokens, from the family's published format (an independent spelling)."""
    end = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>"}[family]
    out = ""
    for k, m in enumerate(messages):
        if m["role"] != A:
            continue
        content = m["content"].strip() if family == "llama3" else m["content"]
        if family == "qwen3" and k == len(messages) - 1 and any(x["role"] == U for x in messages[:k]):
            content = "<think>\n\n</think>\n\n" + content.lstrip("\n")
        out += content + end
    return out


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    dtype = "<u2" if header[0] == 20240520 else "<u4"
    tokens = np.fromfile(path, dtype=dtype, offset=1024)
    mask = np.fromfile(path[:-4] + ".mask", dtype=np.uint8, offset=1024)
    assert tokens.size == header[2] == mask.size
    return tokens.astype(np.int64), mask


for family, tok_dir in families.items():
    hf = AutoTokenizer.from_pretrained(tok_dir)
    engine_tok = mt.Tokenizer.load(os.path.join(tok_dir, "tokenizer.json"))
    recs = records[family]
    src = os.path.join(work, f"{family}.jsonl")
    write_jsonl(src, recs)
    # 1. The text, byte for byte.
    rendered = [json.loads(line) for line in run_tool("render-chat", "--chat-template", family, src).stdout.splitlines()]
    assert len(rendered) == len(recs)
    for i, (r, ours) in enumerate(zip(recs, rendered)):
        theirs = hf.apply_chat_template(r["messages"], tokenize=False)
        assert ours["text"] == theirs, f"{family} record {i}:\nours   {ours['text']!r}\ntheirs {theirs!r}"
    # 2. Shards: the ids of apply_chat_template(tokenize=True), the mask the front door makes, and the
    # masked-in tokens spell the assistant turns.
    out = os.path.join(work, f"{family}-shards")
    run_tool("shards", "--format", "chat", "--tokenizer", tok_dir, "--out", out, "--threads", "2", src)
    tokens, mask = read_shard(os.path.join(out, "train_000000.bin"))
    hf_ids = np.concatenate([hf.apply_chat_template(r["messages"], tokenize=True) for r in recs])
    assert np.array_equal(tokens, hf_ids), f"{family}: ids differ from apply_chat_template"
    front = os.path.join(work, f"{family}-front")
    mt_data.write_shards(recs, "train", front, engine_tok, engine_tok.vocab_size(), hf)
    front_tokens, front_mask = read_shard(os.path.join(front, "train_000000.bin"))
    assert np.array_equal(front_tokens, tokens), f"{family}: front door ids differ"
    assert np.array_equal(front_mask, mask), f"{family}: front door mask differs: {np.nonzero(front_mask != mask)}"
    pos = 0
    for i, r in enumerate(recs):
        n = len(hf.apply_chat_template(r["messages"], tokenize=True))
        ids, m = tokens[pos:pos + n], mask[pos:pos + n]
        trained, expected = hf.decode(ids[m == 1].tolist()), expected_trained(family, r["messages"])
        if any(x["role"] == A and x["content"][:1].isspace() for x in r["messages"]):
            # A token can straddle the end of the prompt ("\n" + content's "\n\n" is one token): it is
            # trained, as transformers' assistant masks (char_to_token) count it; compare without spaces.
            trained, expected = "".join(trained.split()), "".join(expected.split())
        assert trained == expected, (family, i, trained, expected)
        assert m[0] == 0, "the first token of a record is never a target"
        pos += n
    print(f"ok: {family}: {len(recs)} records render as transformers does; {tokens.size} ids = "
          f"apply_chat_template, {int(mask.sum())} trained tokens = the assistant turns; front door equal")

# mt.Trainer given chat records and the Hugging Face tokenizer trains on the shard megatrain-data wrote.
hf = AutoTokenizer.from_pretrained(families["llama3"])
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=len(hf), max_position_embeddings=64))
out = os.path.join(work, "trainer")
trainer = mt.Trainer(model=model, train_dataset=records["llama3"], tokenizer=hf, max_seq_length=16,
                     args={"train.max_steps": 2, "train.output_dir": out, "train.per_device_train_batch_size": 2})
trainer.train()
for ext in (".bin", ".mask"):
    with open(os.path.join(out, "data", "train_000000" + ext), "rb") as a, \
            open(os.path.join(work, "llama3-shards", "train_000000" + ext), "rb") as b:
        assert a.read() == b.read(), f"mt.Trainer's {ext} differs from megatrain-data's"
assert all(0 <= r["tokens"] <= 32 and np.isfinite(r["loss"]) for r in trainer.log_history), trainer.log_history
print(f"ok: mt.Trainer on chat records: megatrain-data's shard; targets per step "
      f"{[r['tokens'] for r in trainer.log_history]}")

# 3. Bad records and templates.
tok_dir = families["qwen3"]
hf = AutoTokenizer.from_pretrained(tok_dir)
engine_tok = mt.Tokenizer.load(os.path.join(tok_dir, "tokenizer.json"))
good = conv((U, "Hi"), (A, "Hello"))
bad_records = [
    (conv((S, "Hi"), (U, "Only a prompt")), "no assistant turn"),
    (conv((U, "Hi"), ("robot", "beep"), (A, "x")), "messages[1]: unknown role 'robot'"),
    ({"messages": [{"role": U}, {"role": A, "content": "x"}]}, "messages[0] has no 'content'"),
    ({"messages": [{"content": "x"}]}, "messages[0] has no 'role'"),
    ({"text": "no messages"}, "no field 'messages'"),
]
for rec, needle in bad_records:
    out = os.path.join(work, "bad-out")
    os.makedirs(out, exist_ok=True)
    src = os.path.join(work, "bad.jsonl")
    write_jsonl(src, [good, good, rec])
    p = run_tool("shards", "--format", "chat", "--tokenizer", tok_dir, "--out", out, src, ok=False)
    assert p.returncode == 1, p
    assert f"{src}:3: " in p.stderr and needle in p.stderr, (needle, p.stderr)
    assert not [f for f in os.listdir(out) if f.startswith("train_")], os.listdir(out)
    if "no field 'messages'" not in needle:
        try:
            mt_data.write_shards([good, rec], "train", os.path.join(work, "bad-front"), engine_tok,
                                 engine_tok.vocab_size(), hf)
            raise AssertionError(f"front door took {rec}")
        except mt.ConfigError as e:
            assert "example 1" in str(e) and needle.split(": ")[-1].split(" (")[0] in str(e), (needle, str(e))
        assert not os.listdir(os.path.join(work, "bad-front")), "front door left a shard"
    print(f"ok: {p.stderr.strip()}")
write_jsonl(os.path.join(work, "m.jsonl"), [good, conv((U, "a"), (U, "b"), (A, "c"))])
p = run_tool("shards", "--format", "chat", "--chat-template", "mistral", "--tokenizer", families["mistral"], "--out",
             os.path.join(work, "bad-out"), os.path.join(work, "m.jsonl"), ok=False)
assert p.returncode == 1 and "m.jsonl:2: messages[1]: role 'user' where template mistral expects 'assistant'" in \
    p.stderr, p.stderr
print(f"ok: {p.stderr.strip()}")
bad_templates = [
    ("{\"roles\": {\"user\": {\"prefix\": \"U: \"}}}", "roles has no 'assistant'"),
    ("{\"roles\": {\"assistant\": {\"prefix\": 3}}}", "roles.assistant.prefix is not a string"),
    ("{\"roles\": {\"assistant\": {}}, \"colour\": 1}", "unknown field 'colour'"),
    ("{\"roles\": ", "chat template is not valid JSON"),
    ("{\"roles\": {\"assistant\": {\"end\": \"<|not_a_token|>\"}}}", "has no token '<|not_a_token|>'"),
]
write_jsonl(os.path.join(work, "ok.jsonl"), [good])
for text, needle in bad_templates:
    path = os.path.join(work, "bad-template.json")
    with open(path, "w") as f:
        f.write(text)
    p = run_tool("shards", "--format", "chat", "--chat-template", path, "--tokenizer", tok_dir, "--out",
                 os.path.join(work, "bad-out"), os.path.join(work, "ok.jsonl"), ok=False)
    assert p.returncode == 1 and needle in p.stderr, (needle, p.stderr)
    assert not [f for f in os.listdir(os.path.join(work, "bad-out")) if f.startswith("train_")]
    print(f"ok: {p.stderr.strip()}")
