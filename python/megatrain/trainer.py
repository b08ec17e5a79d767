"""mt.Trainer: transformers.Trainer's interface over the megatrain engine, run in this process."""
import collections
import glob
import json
import logging
import math
import os
import shutil

import numpy as np

from . import _engine, arguments, config, data
from .errors import ConfigError, MegatrainError

logger = logging.getLogger("megatrain")

try:
    from transformers.trainer_utils import TrainOutput
except ImportError:  # transformers is optional: the same named tuple
    TrainOutput = collections.namedtuple("TrainOutput", ["global_step", "training_loss", "metrics"])


def _model_config_json(model):
    """config.json text of a transformers model or an HF directory (ConfigError when there is none)."""
    if isinstance(model, (str, os.PathLike)):
        path = os.path.join(str(model), "config.json")
        if not os.path.isfile(path):
            raise ConfigError(f"model: {path} not found (a Hugging Face model directory holds config.json)")
        with open(path) as f:
            return f.read()
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_json_string") or not hasattr(model, "state_dict"):
        raise ConfigError(f"model: {type(model).__name__} is not a transformers causal LM (no .config) nor a path "
                          "to a Hugging Face model directory")
    text = cfg.to_json_string(use_diff=False)
    j = json.loads(text)
    if not j.get("architectures"):  # set by save_pretrained; a model made from a config has none yet
        j["architectures"] = [type(model).__name__]
    return json.dumps(j, indent=2)


def _shard_windows(pattern, seq_length):
    """Sequences of seq_length+1 tokens the engine's loader finds in llm.c shards (for num_train_epochs)."""
    windows = 0
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype="<i4", count=3)
        if len(header) < 3 or header[0] not in (20240520, 20240801):
            raise ConfigError(f"{path}: not an llm.c shard; num_train_epochs needs them (or set max_steps)")
        windows += (int(header[2]) - 1) // seq_length if header[2] > seq_length else 0
    return windows


def _packing_default(keys, train_dataset):
    """The one place where the front door picks data.packing (issue 53): examples are documents, so once the
    engine has the key, datasets of examples default to `documents` (shard paths keep the engine's default)."""
    if "data.packing" in keys or data._is_paths(train_dataset) or "data.packing" not in set(_engine.config_keys()):
        return
    keys["data.packing"] = "documents"


class Trainer:
    """Trains a transformers causal LM (Llama, Qwen2, Qwen3, Mistral, GPT-2) with the engine.

    model: a transformers model (its weights are handed to the engine stage by stage and the trained
        weights are loaded back into it) or the path of a Hugging Face model directory.
    args: transformers.TrainingArguments, or a dict of engine keys ("train.max_steps": 10, ...).
    train_dataset / eval_dataset: see megatrain.data (dicts with input_ids and optional labels and
        attention_mask; text plus tokenizer; messages plus a Hugging Face tokenizer; or llm.c shard paths).
        eval_dataset is written as data.validation_files.
    tokenizer: for text and chat datasets; a fast HF tokenizer, a megatrain.Tokenizer or a tokenizer.json
        path (chat records need the HF tokenizer: its chat template renders them).
    on_step: called with a dict (step, loss, lr, grad_norm, tokens, ...) after every step.
    max_seq_length: tokens per sequence (data.seq_length); default: the engine key when args is a dict,
        else min(1024, the model's max_position_embeddings).
    engine_args: further engine keys, applied last (e.g. {"device.max_vram_gb": 0.5}).
    """

    def __init__(self, model=None, args=None, train_dataset=None, eval_dataset=None, tokenizer=None, *,
                 on_step=None, max_seq_length=None, engine_args=None, processing_class=None):
        if model is None:
            raise ConfigError("model: required (a transformers causal LM or a Hugging Face model directory)")
        if train_dataset is None:
            raise ConfigError("train_dataset: required")
        self.model = model
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.tokenizer = tokenizer if tokenizer is not None else processing_class
        self.on_step = on_step
        self.log_history = []
        self._config_json = _model_config_json(model)
        try:
            self._model = _engine.model_summary(self._config_json)
        except ValueError as e:
            raise ConfigError(f"model: {e}") from None
        self._tokenizer, self._tokenizer_json = data.engine_tokenizer(self.tokenizer)
        self._check_first_example(train_dataset, "train")
        if eval_dataset is not None:
            self._check_first_example(eval_dataset, "eval")

        self._epochs = None
        if args is None:
            keys = {}
        elif isinstance(args, dict):
            keys = dict(args)
        elif hasattr(args, "to_dict") and hasattr(args, "per_device_train_batch_size"):
            keys, self._epochs = arguments.engine_keys(args, set(_engine.config_keys()))
        else:
            raise ConfigError(f"args: expected transformers.TrainingArguments or a dict of engine keys, got "
                              f"{type(args).__name__}")
        self.args = args
        if max_seq_length is not None:
            keys["data.seq_length"] = int(max_seq_length)
        elif "data.seq_length" not in keys:
            keys["data.seq_length"] = min(1024, int(self._model["max_position_embeddings"]))
        keys.update(engine_args or {})
        self._keys = keys
        self.arguments = None  # the engine arguments of the last train() (`megatrain train` takes the same)

    def _check_first_example(self, dataset, name):
        """The dataset's kind is checked now, so a wrong one fails before anything is written."""
        if data._is_paths(dataset):
            return
        data.check_kind(dataset, name)
        try:
            first = dataset[0]
        except (TypeError, KeyError, IndexError):
            return  # an iterable without indexing: checked while writing
        data.example_field(first, name, self._tokenizer, self.tokenizer)

    @property
    def output_dir(self):
        return self._keys.get("train.output_dir", config.defaults().get("train.output_dir", "run/out"))

    def _engine_keys(self, resume_from_checkpoint):
        keys = config.defaults()
        keys.update({k: v for k, v in self._keys.items()})
        out = keys.setdefault("train.output_dir", "run/out")
        data_dir = os.path.join(out, "data")
        vocab = int(self._model["vocab_size"])
        keys["data.train_files"] = data.write_shards(self.train_dataset, "train", data_dir, self._tokenizer, vocab,
                                                     self.tokenizer)
        if self.eval_dataset is not None:
            keys["data.validation_files"] = data.write_shards(self.eval_dataset, "val", data_dir, self._tokenizer,
                                                              vocab, self.tokenizer)
        _packing_default(keys, self.train_dataset)
        if self._tokenizer_json is not None:
            path = os.path.join(data_dir, "tokenizer.json")
            with open(path, "w") as f:
                f.write(self._tokenizer_json)
            keys["data.tokenizer_file"] = path
        elif isinstance(self.tokenizer, (str, os.PathLike)):
            path = str(self.tokenizer)
            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            if os.path.isfile(path):  # (GPT-2's encoder.json + vocab.bpe: the shards' ids are checked)
                keys["data.tokenizer_file"] = path
        if isinstance(self.model, (str, os.PathLike)):
            keys["model.model_name_or_path"] = str(self.model)
            keys.setdefault("train.export_hf_dir", os.path.join(out, "final-model"))
        else:
            model_dir = os.path.join(out, "model")
            os.makedirs(model_dir, exist_ok=True)
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                f.write(self._config_json)
            keys["model.config_file"] = os.path.join(model_dir, "config.json")
        if self._epochs is not None and "train.max_steps" not in keys:
            per_step = int(keys.get("train.per_device_train_batch_size", 4)) * int(
                keys.get("train.gradient_accumulation_steps", 1))
            windows = _shard_windows(keys["data.train_files"], int(keys["data.seq_length"]))
            keys["train.max_steps"] = max(1, math.ceil(self._epochs * windows / per_step))
            logger.info("num_train_epochs=%g: %d steps (%d sequences of %s tokens)", self._epochs,
                        keys["train.max_steps"], windows, keys["data.seq_length"])
        if "_warmup" in keys:
            arguments.finish_steps(keys)
        if resume_from_checkpoint is True:
            keys["train.resume_from_checkpoint"] = "latest"
        elif resume_from_checkpoint:
            keys["train.resume_from_checkpoint"] = str(resume_from_checkpoint)
        elif "train.resume_from_checkpoint" not in self._keys:
            keys["train.resume_from_checkpoint"] = ""
        return keys

    def _weight_source(self):
        import torch
        state = self.model.state_dict()

        def source(name):
            t = state.get(name)
            if t is None:
                raise KeyError(f"the model has no tensor {name}")
            return t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()

        return source

    def _weight_sink(self):
        import torch
        state = self.model.state_dict()

        def sink(name, array):
            with torch.no_grad():
                state[name].copy_(torch.from_numpy(array))

        return sink

    def train(self, resume_from_checkpoint=None, **unused):
        """Runs the engine; returns TrainOutput(global_step, training_loss, metrics). resume_from_checkpoint:
        True = the latest checkpoint in output_dir, or a checkpoint directory. Ctrl-C stops after the step
        in progress with a final checkpoint (metrics["interrupted"] is then True)."""
        if unused:
            raise ConfigError(f"train(): unsupported arguments {sorted(unused)}")
        keys = self._engine_keys(resume_from_checkpoint)
        self.arguments = config.to_arguments(keys)
        torch_model = not isinstance(self.model, (str, os.PathLike))

        def on_message(is_error, line):
            (logger.warning if is_error else logger.info)("%s", line)

        def on_step(record):
            self.log_history.append(record)
            if self.on_step is not None:
                self.on_step(record)

        config.check(keys)  # the engine's validation (files included): ConfigError naming the key
        result = _engine.train(self.arguments, self._config_json, self._weight_source() if torch_model else None,
                               self._weight_sink() if torch_model else None, on_message, on_step)
        if result["exit_status"] != 0:
            error = result["error"]
            raise (MegatrainError if error.startswith("training failed") else ConfigError)(error)
        steps = result["steps"]
        if result["interrupted"]:
            logger.warning("megatrain: stopped by Ctrl-C after step %d; final checkpoint in %s",
                           result["steps_done"], keys["train.output_dir"])
        wall = max(result["wall_s"], 1e-9)
        batch = int(keys.get("train.per_device_train_batch_size", 4)) * int(
            keys.get("train.gradient_accumulation_steps", 1))
        loss = float(np.mean([s["loss"] for s in steps])) if steps else 0.0
        metrics = {
            "train_runtime": result["wall_s"],
            "train_samples_per_second": batch * len(steps) / wall,
            "train_steps_per_second": len(steps) / wall,
            "train_tokens_per_second": result["tokens_per_step"] * len(steps) / wall,
            "train_loss": loss,
            "interrupted": bool(result["interrupted"]),
            "checkpoints": result["checkpoints"],
        }
        self._final_dir = keys.get("train.export_hf_dir") or None
        return TrainOutput(int(result["steps_done"]), loss, metrics)

    def save_model(self, output_dir=None):
        """Writes the model as a Hugging Face directory with the engine's export (safetensors, config.json),
        and the tokenizer's files when it is a Hugging Face tokenizer."""
        output_dir = str(output_dir or self.output_dir)
        if isinstance(self.model, (str, os.PathLike)):
            source = getattr(self, "_final_dir", None) or str(self.model)
            os.makedirs(output_dir, exist_ok=True)
            for name in os.listdir(source):
                if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json"):
                    shutil.copy2(os.path.join(source, name), os.path.join(output_dir, name))
        else:
            try:
                _engine.export_hf(output_dir, self._config_json, self._weight_source())
            except RuntimeError as e:
                raise MegatrainError(f"save_model({output_dir}): {e}") from None
        if hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(output_dir)
