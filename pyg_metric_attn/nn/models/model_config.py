"""A model's architecture as a config dataclass plus keyword overrides."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

Config = TypeVar('Config')


def model_config(config_class: type[Config], config: Config | None,
                 overrides: dict[str, Any], model: str) -> Config:
    """``config`` (default ``config_class()``) with the fields named in
    ``overrides`` replaced, as a model's ``__init__(..., config=None,
    **kwargs)`` takes them: a config of another class or an unknown field is
    a :class:`TypeError` naming the ``model``, a bad value the config's own
    error."""
    if config is None:
        config = config_class()
    elif not isinstance(config, config_class):
        raise TypeError(f"'config' must be a {config_class.__name__}, got "
                        f"{type(config).__name__} {config!r} (the width is "
                        f"'hidden_channels=...')")
    unknown = set(overrides) - {f.name for f in fields(config_class)}
    if unknown:
        raise TypeError(f"{model} got unknown arguments {sorted(unknown)}; the "
                        f"architecture's are the fields of "
                        f"{config_class.__name__}")
    return replace(config, **overrides)
