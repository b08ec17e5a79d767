"""megatrain for Python: the C++ engine behind the interface Hugging Face users already know.

    import megatrain as mt
    mt.init(max_vram_gb=80)
    trainer = mt.Trainer(model=model, train_dataset=dataset, args=TrainingArguments(...))
    trainer.train()

Python only hands the engine a configuration and data and gets the weights back; the engine (actors,
checkpoints, logs) runs in this process exactly as `megatrain train` does.
"""
import numpy as _numpy

from . import _engine

if int(_numpy.__version__.split(".")[0]) >= 2 and not _engine.numpy2_supported:
    raise ImportError(f"megatrain was built with pybind11 {_engine.pybind11_version}, which does not support "
                      f"NumPy {_numpy.__version__}: install numpy<2 (or build with pybind11 >= 2.12)")
from ._engine import Tokenizer
from .config import init
from .errors import ConfigError, MegatrainError
from .trainer import Trainer, TrainOutput

__all__ = ["init", "Trainer", "TrainOutput", "Tokenizer", "MegatrainError", "ConfigError", "engine_keys"]


def engine_keys():
    """Every engine key this build knows, as "section.key" (config/README.md says what each does)."""
    return list(_engine.config_keys())
