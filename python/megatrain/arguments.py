"""transformers.TrainingArguments -> engine keys.

Only fields that differ from TrainingArguments' own defaults are looked at. A field the engine knows
maps to its key; a field that would change the trained weights and that the engine cannot honour is a
ConfigError naming the field; any other field (reporting, devices, data-loader workers, ...) has no
effect on the result and is warned about once per process.
"""
import dataclasses
import logging
import math

from .errors import ConfigError

logger = logging.getLogger("megatrain")
_warned = set()

# TrainingArguments field -> engine key (same meaning, same units).
_DIRECT = {
    "output_dir": "train.output_dir",
    "per_device_train_batch_size": "train.per_device_train_batch_size",
    "gradient_accumulation_steps": "train.gradient_accumulation_steps",
    "learning_rate": "train.learning_rate",
    "weight_decay": "train.weight_decay",
    "adam_beta1": "train.adam_beta1",
    "adam_beta2": "train.adam_beta2",
    "adam_epsilon": "train.adam_epsilon",
    "seed": "train.seed",
    "bf16": "train.bf16",
}
# Handled below (they depend on each other or need a conversion).
_CONVERTED = {
    "max_steps", "num_train_epochs", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "lr_scheduler_kwargs",
    "max_grad_norm", "save_steps", "save_strategy", "save_total_limit", "logging_steps", "logging_strategy",
    "optim", "data_seed", "eval_strategy", "evaluation_strategy", "eval_steps", "per_device_eval_batch_size",
}
# Fields that change what is trained (their non-default values), with why the engine cannot honour them.
_REFUSED = {
    "fp16": "the engine computes in fp32 or bf16 (use bf16=True)",
    "label_smoothing_factor": "the engine's loss is plain cross-entropy",
    "group_by_length": "the engine samples fixed-length windows of the token stream",
    "neftune_noise_alpha": "the engine adds no embedding noise",
    "ignore_data_skip": "the engine always resumes at the exact data position",
    "optim_args": "the engine's optimizer is AdamW with the adam_* fields",
    "adafactor": "the engine's optimizer is AdamW",
}
_ADAMW = {"adamw_torch", "adamw_hf", "adamw_torch_fused"}
# Fields that never say anything about the run (names, paths, hub settings, derived values).
_SILENT = {"logging_dir", "run_name", "overwrite_output_dir", "do_train", "do_eval", "do_predict"}


def _value(x):
    return getattr(x, "value", x)  # enums (SchedulerType, IntervalStrategy, OptimizerNames) -> their text


def _warn_once(field, message):
    if field in _warned:
        return
    _warned.add(field)
    logger.warning("TrainingArguments.%s: %s", field, message)


def _steps(value, max_steps):
    """HF's logging_steps / save_steps / eval_steps: a float below 1 is a fraction of max_steps."""
    if isinstance(value, float) and value < 1:
        return math.ceil(max_steps * value) if max_steps > 0 else None
    return int(value)


def changed_fields(args):
    """{field: value} for every field of `args` that differs from TrainingArguments' default."""
    default = type(args)(output_dir=args.output_dir)
    out = {}
    for f in dataclasses.fields(args):
        if not f.init or f.name.startswith("_"):
            continue
        value, base = getattr(args, f.name, None), getattr(default, f.name, None)
        if _value(value) != _value(base):
            out[f.name] = value
    return out


def engine_keys(args, engine_knows):
    """(keys, epochs): the engine keys of a TrainingArguments, and num_train_epochs when max_steps is
    not set (the caller turns it into steps once the data's size is known; then call finish_steps)."""
    changed = changed_fields(args)
    keys = {key: getattr(args, field) for field, key in _DIRECT.items()}
    keys["train.bf16"] = bool(args.bf16)
    for field, value in changed.items():
        if field in _DIRECT or field in _CONVERTED or field in _SILENT:
            continue
        reason = _REFUSED.get(field)
        if reason:
            raise ConfigError(f"TrainingArguments.{field}={value!r}: the engine cannot honour it ({reason})")
        if field.startswith("hub_") or field.startswith("push_to_hub"):
            continue
        _warn_once(field, f"{value!r} has no effect on a megatrain run (ignored)")

    optim = _value(args.optim)
    if optim not in _ADAMW:
        raise ConfigError(f"TrainingArguments.optim={optim!r}: the engine's optimizer is AdamW "
                          f"(one of {sorted(_ADAMW)})")
    if args.data_seed is not None and args.data_seed != args.seed:
        raise ConfigError(f"TrainingArguments.data_seed={args.data_seed}: the engine draws the data order "
                          f"from seed ({args.seed}); set data_seed=None or equal to seed")
    keys["train.max_grad_norm"] = float(args.max_grad_norm or 0.0)
    keys["train.save_total_limit"] = int(args.save_total_limit or 0)

    schedule = _value(args.lr_scheduler_type)
    kwargs = dict(args.lr_scheduler_kwargs or {})
    if schedule == "constant":
        keys["train.lr_scheduler_type"] = "constant"
        if args.warmup_steps or args.warmup_ratio:
            _warn_once("warmup_steps", "lr_scheduler_type='constant' has no warmup in transformers "
                       "(use 'constant_with_warmup'); none is applied")
        keys["train.warmup_steps"] = 0
    elif schedule in ("constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"):
        keys["train.lr_scheduler_type"] = {"constant_with_warmup": "constant"}.get(schedule, schedule).replace(
            "cosine_with_min_lr", "cosine")
        if schedule == "cosine_with_min_lr":
            if "min_lr_rate" in kwargs:
                keys["train.min_lr_ratio"] = float(kwargs.pop("min_lr_rate"))
            elif "min_lr" in kwargs:
                keys["train.min_lr_ratio"] = float(kwargs.pop("min_lr")) / args.learning_rate
            else:
                raise ConfigError("TrainingArguments.lr_scheduler_kwargs: cosine_with_min_lr needs min_lr_rate "
                                  "or min_lr")
    else:
        raise ConfigError(f"TrainingArguments.lr_scheduler_type={schedule!r}: the engine has constant, "
                          "constant_with_warmup, linear, cosine and cosine_with_min_lr")
    if kwargs:
        raise ConfigError(f"TrainingArguments.lr_scheduler_kwargs={kwargs!r}: not supported by the engine's "
                          f"{schedule} schedule")

    epochs = None
    if args.max_steps > 0:
        keys["train.max_steps"] = args.max_steps
    else:
        epochs = float(args.num_train_epochs)
    keys["_warmup"] = (args.warmup_steps, args.warmup_ratio, schedule)
    keys["_logging"] = (_value(args.logging_strategy), args.logging_steps)
    keys["_saving"] = (_value(args.save_strategy), args.save_steps)
    eval_strategy = _value(getattr(args, "eval_strategy", getattr(args, "evaluation_strategy", "no")))
    if eval_strategy == "steps" and "train.eval_steps" in engine_knows:
        keys["_eval"] = args.eval_steps if args.eval_steps is not None else args.logging_steps
    elif eval_strategy != "no":
        _warn_once("eval_strategy", f"{eval_strategy!r}: this engine build does not evaluate during training "
                   "(ignored)")
    return keys, epochs


def finish_steps(keys):
    """Resolves the fields that depend on max_steps (warmup_ratio, fractional logging/save steps)."""
    max_steps = int(keys["train.max_steps"])
    warmup_steps, warmup_ratio, schedule = keys.pop("_warmup")
    if schedule != "constant":
        keys["train.warmup_steps"] = warmup_steps if warmup_steps > 0 else math.ceil(max_steps * warmup_ratio)
    strategy, steps = keys.pop("_logging")
    if strategy == "steps":
        keys["log.logging_steps"] = max(1, _steps(steps, max_steps))
    elif strategy != "no":
        _warn_once("logging_strategy", f"{strategy!r}: the engine logs every logging_steps steps (every step)")
    strategy, steps = keys.pop("_saving")
    if strategy == "steps":
        keys["train.save_steps"] = _steps(steps, max_steps)
    elif strategy == "no":
        keys["train.save_steps"] = 0
        _warn_once("save_strategy", "'no': the engine still writes a final checkpoint (it is what resumes)")
    else:
        keys["train.save_steps"] = 0
        _warn_once("save_strategy", f"{strategy!r}: the engine saves every save_steps steps and at the end only")
    if "_eval" in keys:
        keys["train.eval_steps"] = _steps(keys.pop("_eval"), max_steps)
    return keys
