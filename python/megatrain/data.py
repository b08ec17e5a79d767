"""Datasets -> llm.c token shards the engine reads (written with the engine's own ShardWriter).

Why shards and not a Python data source: the engine then owns the data order (seeded, resumable from
the cursor a checkpoint stores), the run is the same as `megatrain train` on those shards, and no
Python runs inside the training loop.

Accepted: a sequence of dicts (or a datasets.Dataset, which iterates as dicts) with "input_ids", or
with "text" plus a tokenizer (a megatrain.Tokenizer, a tokenizer.json path or directory, or a Hugging
Face fast tokenizer, whose tokenizer.json the engine's tokenizer then runs); or llm.c shard paths (a
path, a glob, or a list of paths). Each example's ids are appended to one token stream; texts are
followed by the tokenizer's end-of-text token, as `megatrain-data shards` does.
"""
import glob
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


def write_shards(dataset, name, out_dir, tokenizer, vocab_size):
    """Writes `dataset` as out_dir/<name>_000000.bin; returns the glob the engine reads."""
    if _is_paths(dataset):
        return _link_shards(dataset, name, out_dir)
    check_kind(dataset, name)
    os.makedirs(out_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(out_dir, f"{name}_*.bin")):
        os.remove(stale)
    path = os.path.join(out_dir, f"{name}_000000.bin")
    writer = _engine.ShardWriter(path, 2 if vocab_size <= 65536 else 4)
    eot = tokenizer.eot_id() if tokenizer is not None else None
    field = None
    for i, example in enumerate(dataset):
        if field is None:
            if not hasattr(example, "keys"):
                raise ConfigError(f"{name}_dataset: example 0 is a {type(example).__name__}, not a dict with "
                                  "'input_ids' or 'text'")
            if "input_ids" in example:
                field = "input_ids"
            elif "text" in example:
                if tokenizer is None:
                    raise ConfigError(f"{name}_dataset has 'text' but no 'input_ids': pass tokenizer= (a fast "
                                      "Hugging Face tokenizer, a megatrain.Tokenizer or a tokenizer.json path)")
                field = "text"
            else:
                raise ConfigError(f"{name}_dataset: examples have neither 'input_ids' nor 'text' (example 0 "
                                  f"has {sorted(example.keys())})")
        value = example.get(field) if hasattr(example, "get") else example[field]
        if value is None:
            raise ConfigError(f"{name}_dataset: example {i} has no '{field}'")
        if field == "text":
            ids = tokenizer.encode(str(value))
            if eot is not None:
                ids = np.append(ids, np.uint32(eot))
        else:
            ids = np.asarray(value)
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise ConfigError(f"{name}_dataset: example {i}: input_ids must be a flat list of integers")
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise ConfigError(f"{name}_dataset: example {i}: token id {int(ids.min() if ids.min() < 0 else ids.max())}"
                                  f" is outside the model's vocabulary (model.vocab_size={vocab_size})")
        writer.append(ids)
    if field is None:
        raise ConfigError(f"{name}_dataset is empty")
    writer.commit()
    return os.path.join(out_dir, f"{name}_*.bin")


def _link_shards(paths, name, out_dir):
    """llm.c shards given by path: one path or glob is read where it is; several are linked into out_dir."""
    if isinstance(paths, (str, os.PathLike)):
        return str(paths)
    if len(paths) == 1:
        return str(paths[0])
    links = os.path.join(out_dir, f"{name}-shards")
    os.makedirs(links, exist_ok=True)
    for old in os.listdir(links):
        os.remove(os.path.join(links, old))
    for i, p in enumerate(paths):
        if not os.path.isfile(p):
            raise ConfigError(f"{name}_dataset: shard {p} not found")
        os.symlink(os.path.abspath(p), os.path.join(links, f"{i:06d}_{os.path.basename(p)}"))
    return os.path.join(links, "*")
