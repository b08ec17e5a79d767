"""Engine keys ("section.key" -> value) as the binary's command-line arguments, and mt.init's defaults.

Every value is checked by the engine's own validation (the code behind `megatrain train`), so a bad
value here fails with the same message the binary prints.
"""
from . import _engine
from .errors import ConfigError

_defaults = {}


def to_arguments(keys):
    """{"train.max_steps": 3, ...} -> ["--train.max_steps=3", ...]."""
    known = set(_engine.config_keys())
    out = []
    for key, value in keys.items():
        if key not in known:
            raise ConfigError(f"{key}: not an engine key (megatrain.engine_keys() lists them)")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value) or '""'  # CAF takes an empty value only quoted
        out.append(f"--{key}={text}")
    return out


def check(keys, check_files=True):
    """Raises ConfigError with the engine's message when the keys do not make a valid configuration."""
    error = _engine.check_config(to_arguments(keys), check_files)
    if error:
        raise ConfigError(error)


def init(offload_dir=None, max_vram_gb=None, optimizer_compression=None, **engine_keys):
    """Process-wide defaults for every later Trainer (its own arguments override them).

    offload_dir: NVMe directory for state that does not fit in RAM (train.offload_dir).
    max_vram_gb: the device memory budget in GiB (device.max_vram_gb).
    optimizer_compression: True / False, or the engine's names "none", "lossless", "int8"
        (train.optimizer_compression; True = "lossless").
    engine_keys: any other engine key with "__" for the dot, e.g. threads__total=2.
    Values are validated now, as the engine validates its configuration (ConfigError naming the key).
    """
    keys = {}
    if offload_dir is not None:
        keys["train.offload_dir"] = str(offload_dir)
    if max_vram_gb is not None:
        keys["device.max_vram_gb"] = float(max_vram_gb)
    if optimizer_compression is not None:
        if optimizer_compression is True:
            optimizer_compression = "lossless"
        elif optimizer_compression is False:
            optimizer_compression = "none"
        keys["train.optimizer_compression"] = str(optimizer_compression)
    for name, value in engine_keys.items():
        keys[name.replace("__", ".", 1)] = value
    check(keys, check_files=False)
    _defaults.clear()
    _defaults.update(keys)


def defaults():
    return dict(_defaults)
