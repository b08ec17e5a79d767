"""Datasets -> llm.c token shards the engine reads (written with the engine's own ShardWriter).

Why shards and not a Python data source: the engine then owns the data order (seeded, resumable from
the cursor a checkpoint stores), the run is the same as `megatrain train` on those shards, and no
Python runs inside the training loop.

Accepted: a sequence of dicts (or a datasets.Dataset, which iterates as dicts) with "input_ids" (and
optional "labels", "attention_mask", as Hugging Face reads them), with "text" plus a tokenizer (a
megatrain.Tokenizer, a tokenizer.json path or directory, or a Hugging Face fast tokenizer, whose
tokenizer.json the engine's tokenizer then runs), or with "messages" (chat records) plus a Hugging Face
tokenizer whose chat template renders them; or llm.c shard paths (a path, a glob, or a list of paths).
Each example's ids are appended to one token stream; texts are followed by the tokenizer's end-of-text
token, as `megatrain-data shards` does. Labels of -100, padding and the non-assistant part of a chat become
the shard's loss mask (`x.mask`, 1 = the token is a target): the loss is the mean over the targets of a step.
"""
import glob
import itertools
import os

import numpy as np

from . import _engine
from .errors import ConfigError


def _is_paths(dataset):
    if isinstance(dataset, (str, os.PathLike)):
        return True
    return isinstance(dataset, (list, tuple)) and len(dataset) > 0 and all(
        isinstance(p, (str, os.PathLike)) for p in dataset)


def check_kind(dataset, name):
    if isinstance(dataset, (dict, bytes)) or not hasattr(dataset, "__iter__"):
        raise ConfigError(f"{name}_dataset: expected a sequence of dicts with 'input_ids' or 'text', or shard "
                          f"paths; got {type(dataset).__name__}")


def engine_tokenizer(tokenizer):
    """(megatrain.Tokenizer, tokenizer.json text or None) for what the user passed."""
    if tokenizer is None or isinstance(tokenizer, _engine.Tokenizer):
        return tokenizer, None
    if isinstance(tokenizer, (str, os.PathLike)):
        return _engine.Tokenizer.load(str(tokenizer)), None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(f"tokenizer: {type(tokenizer).__name__} is not supported (pass a fast Hugging Face "
                          "tokenizer, a megatrain.Tokenizer, or a tokenizer.json path)")
    text = backend.to_str()
    return _engine.Tokenizer.from_json_text(text, "tokenizer.json"), text


def write_shards(dataset, name, out_dir, tokenizer, vocab_size, hf_tokenizer=None):
    """Writes `dataset` as out_dir/<name>_000000.bin (and <name>_000000.mask when examples carry labels,
    padding or chat turns); returns the glob the engine reads. On error nothing is left in out_dir."""
    if _is_paths(dataset):
        return _link_shards(dataset, name, out_dir)
    check_kind(dataset, name)
    os.makedirs(out_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(out_dir, f"{name}_*.bin")) + glob.glob(os.path.join(out_dir, f"{name}_*.mask")):
        os.remove(stale)
    examples = iter(dataset)
    first = next(examples, None)
    if first is None:
        raise ConfigError(f"{name}_dataset is empty")
    field = example_field(first, name, tokenizer, hf_tokenizer)
    masked = field == "messages" or (field == "input_ids" and ("labels" in first or "attention_mask" in first))
    path = os.path.join(out_dir, f"{name}_000000.bin")
    writer = _engine.ShardWriter(path, 2 if vocab_size <= 65536 else 4, masked)
    try:
        for ids, mask in _encode_examples(itertools.chain([first], examples), field, masked, name, tokenizer,
                                          hf_tokenizer, vocab_size):
            writer.append(ids, mask)
        writer.commit()
    except BaseException:
        writer = None  # the uncommitted writer removes its temporary files now, not when the traceback goes
        raise
    return os.path.join(out_dir, f"{name}_*.bin")


def example_field(example, name, tokenizer, hf_tokenizer):
    """Which field of the examples is read: 'input_ids', 'text' or 'messages' (ConfigError otherwise)."""
    if not hasattr(example, "keys"):
        raise ConfigError(f"{name}_dataset: example 0 is a {type(example).__name__}, not a dict with "
                          "'input_ids', 'text' or 'messages'")
    if "input_ids" in example:
        return "input_ids"
    if "text" in example:
        if tokenizer is None:
            raise ConfigError(f"{name}_dataset has 'text' but no 'input_ids': pass tokenizer= (a fast "
                              "Hugging Face tokenizer, a megatrain.Tokenizer or a tokenizer.json path)")
        return "text"
    if "messages" in example:
        if hf_tokenizer is None or not hasattr(hf_tokenizer, "apply_chat_template") or tokenizer is None:
            raise ConfigError(f"{name}_dataset has 'messages' (chat records): pass tokenizer= a fast Hugging Face "
                              "tokenizer with a chat template")
        return "messages"
    raise ConfigError(f"{name}_dataset: examples have neither 'input_ids' nor 'text' nor 'messages' (example 0 "
                      f"has {sorted(example.keys())})")


def _encode_examples(examples, field, masked, name, tokenizer, hf_tokenizer, vocab_size):
    """(ids, mask or None) of each example (a generator: the frames an error keeps hold no writer)."""
    eot = tokenizer.eot_id() if tokenizer is not None else None
    for i, example in enumerate(examples):
        value = example.get(field) if hasattr(example, "get") else example[field]
        if value is None:
            raise ConfigError(f"{name}_dataset: example {i} has no '{field}'")
        mask = None
        if field == "text":
            ids = tokenizer.encode(str(value))
            if eot is not None:
                ids = np.append(ids, np.uint32(eot))
        elif field == "messages":
            ids, mask = chat_example(hf_tokenizer, tokenizer, value, f"{name}_dataset: example {i}")
        else:
            ids, mask = token_example(example, f"{name}_dataset: example {i}", vocab_size)
            if mask is not None and not masked:
                raise ConfigError(f"{name}_dataset: example {i} has 'labels' or 'attention_mask' but example 0 has "
                                  "neither: give them to every example or to none")
        yield ids, mask


def _int_list(value, what, n=None):
    a = np.asarray(value)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ConfigError(f"{what} must be a flat list of integers")
    if n is not None and a.size != n:
        raise ConfigError(f"{what} has {a.size} entries, 'input_ids' has {n}")
    return a.astype(np.int64)


def token_example(example, where, vocab_size):
    """(ids, mask or None) of a pre-tokenized example. Hugging Face's rules: labels[j] is -100 (token j is
    not a target) or input_ids[j] (transformers shifts labels inside the model, so a label can only mark a
    target, never change it); attention_mask[j] == 0 is padding, dropped from the stream."""
    get = example.get if hasattr(example, "get") else (lambda k: example[k] if k in example else None)
    ids = _int_list(get("input_ids"), f"{where}: input_ids")
    labels, attention = get("labels"), get("attention_mask")
    target = np.ones(ids.size, dtype=bool)
    keep = target
    if labels is not None:
        lab = _int_list(labels, f"{where}: 'labels'", ids.size)
        bad = np.nonzero((lab != -100) & (lab != ids))[0]
        if bad.size:
            j = int(bad[0])
            raise ConfigError(f"{where}: labels[{j}] = {int(lab[j])} is neither -100 nor input_ids[{j}] = "
                              f"{int(ids[j])} (transformers shifts labels inside the model: a label marks its "
                              "token as a target or not, it cannot name another one)")
        target = lab != -100
    if attention is not None:
        am = _int_list(attention, f"{where}: 'attention_mask'", ids.size)
        bad = np.nonzero((am != 0) & (am != 1))[0]
        if bad.size:
            raise ConfigError(f"{where}: attention_mask[{int(bad[0])}] = {int(am[bad[0]])} (0 or 1 expected)")
        keep = am != 0
    ids, target = ids[keep], target[keep]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ConfigError(f"{where}: token id {int(ids.min() if ids.min() < 0 else ids.max())}"
                          f" is outside the model's vocabulary (model.vocab_size={vocab_size})")
    mask = target.astype(np.uint8) if labels is not None or attention is not None else None
    return ids.astype(np.uint32), mask


CHAT_ROLES = ("system", "user", "assistant")


def check_messages(messages, where):
    """The checks `megatrain-data shards --format chat` makes on a record's messages."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for k, m in enumerate(messages):
        if not hasattr(m, "get"):
            raise ConfigError(f"{where}: messages[{k}] is not an object")
        role, content = m.get("role"), m.get("content")
        if role is None:
            raise ConfigError(f"{where}: messages[{k}] has no 'role'")
        if role not in CHAT_ROLES:
            raise ConfigError(f"{where}: messages[{k}]: unknown role '{role}' (system, user, assistant)")
        if content is None:
            raise ConfigError(f"{where}: messages[{k}] has no 'content'")
        if not isinstance(content, str):
            raise ConfigError(f"{where}: messages[{k}].content is not a string")
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(f"{where}: no assistant turn (the loss covers assistant turns only)")
    if messages[0]["role"] == "assistant":
        raise ConfigError(f"{where}: messages[0] is an assistant turn: a conversation starts with a prompt")


def _render(hf_tokenizer, messages, where, **kw):
    try:
        return hf_tokenizer.apply_chat_template(list(messages), tokenize=False, **kw)
    except Exception as e:  # jinja2's TemplateError, or the template's raise_exception
        raise ConfigError(f"{where}: the tokenizer's chat template does not render it: {e}") from None


def chat_spans(hf_tokenizer, messages, where):
    """(text, [(begin, end) character ranges trained on]) of a chat record, rendered by the tokenizer's own
    chat template. Each assistant turn's range runs from the end of the generation prompt that precedes it
    (the rendering of the turns before it with add_generation_prompt=True) through the special token that
    ends it (the last added token of the turn rendered alone), found in the whole conversation's text. The
    template's {% generation %} blocks would give this directly, but Qwen's, Llama-3's and Mistral's
    templates have none."""
    check_messages(messages, where)
    text = _render(hf_tokenizer, messages, where)
    added = sorted(hf_tokenizer.get_added_vocab(), key=len, reverse=True)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = _render(hf_tokenizer, messages[:k], where, add_generation_prompt=True)
        turn = _render(hf_tokenizer, messages[:k + 1], where)
        if not text.startswith(prompt) or not turn.startswith(prompt):
            raise ConfigError(f"{where}: messages[{k}]: the chat template renders the turns before it differently "
                              "alone and in the whole conversation: the assistant turn cannot be located")
        tail = turn[len(prompt):]
        end_token, at = None, -1
        for t in added:  # the special token that ends the turn: the last one in its rendering
            p = tail.rfind(t)
            if p > at:
                end_token, at = t, p
        begin = len(prompt)
        if end_token is None:
            end = begin + len(tail)
        else:
            p = text.find(end_token, begin)
            end = p + len(end_token) if p >= 0 else begin + len(tail)
        spans.append((begin, end))
    return text, spans


def chat_example(hf_tokenizer, engine_tokenizer, messages, where):
    """(ids, mask) of a chat record: the ids of the tokenizer's apply_chat_template, mask 1 on the tokens that
    overlap an assistant turn's trained range (its content and end token)."""
    text, spans = chat_spans(hf_tokenizer, messages, where)
    ids = np.asarray(hf_tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.uint32)
    return ids, overlap_mask(engine_tokenizer, ids, text.encode("utf-8"),
                             [(len(text[:b].encode("utf-8")), len(text[:e].encode("utf-8"))) for b, e in spans], where)


def overlap_mask(engine_tokenizer, ids, data, byte_spans, where):
    """1 where token i's bytes overlap one of byte_spans (the same rule as megatrain-data's chat format)."""
    lengths = engine_tokenizer.token_lengths(ids)
    ends = np.cumsum(lengths)
    if ends.size and ends[-1] != len(data):
        raise ConfigError(f"{where}: the tokenizer's tokens spell {int(ends[-1])} bytes, the rendered chat "
                          f"{len(data)} (a normalizer changes the text): assistant turns cannot be located")
    starts = ends - lengths
    mask = np.zeros(ids.size, dtype=np.uint8)
    for b, e in byte_spans:
        mask[(starts < e) & (ends > b)] = 1
    return mask


def _link_shards(paths, name, out_dir):
    """llm.c shards given by path: one path or glob is read where it is; several are linked into out_dir,
    each with its sidecars (the loss mask `.mask`, the document starts `.docs`, a Megatron `.idx`)."""
    if isinstance(paths, (str, os.PathLike)):
        return str(paths)
    if len(paths) == 1:
        return str(paths[0])
    exts = {os.path.splitext(str(p))[1] for p in paths}
    if len(exts) != 1:
        raise ConfigError(f"{name}_dataset: the shards have different extensions ({sorted(exts)}); give one kind")
    links = os.path.join(out_dir, f"{name}-shards")
    os.makedirs(links, exist_ok=True)
    for old in os.listdir(links):
        os.remove(os.path.join(links, old))
    for i, p in enumerate(paths):
        if not os.path.isfile(p):
            raise ConfigError(f"{name}_dataset: shard {p} not found")
        stem = os.path.splitext(os.path.abspath(p))[0]
        link_stem = os.path.join(links, f"{i:06d}_{os.path.basename(stem)}")
        os.symlink(os.path.abspath(p), link_stem + exts.copy().pop())
        for sidecar in (".mask", ".docs", ".idx"):
            if os.path.isfile(stem + sidecar):
                os.symlink(stem + sidecar, link_stem + sidecar)
    return os.path.join(links, "*" + exts.pop())
