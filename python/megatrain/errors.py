"""The exceptions megatrain raises. Messages are the engine's own (they name the key, file or tensor)."""


class MegatrainError(RuntimeError):
    """A run failed: the engine's message, naming the file, key or tensor."""


class ConfigError(MegatrainError, ValueError):
    """A configuration the engine refuses: a bad key or value, an unsupported model or argument, bad data."""
