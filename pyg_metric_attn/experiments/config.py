"""Typed task settings: a task's config is a frozen dataclass whose fields
are its settings, each with a type (its annotation) and, where it has one, a
range (:func:`setting`). Options given by name, as the command line's
``-o KEY=VALUE`` gives them, are checked against both with an error that
names the option, the allowed type or range and the default.

A field whose type is itself a dataclass (e.g. a model's config) is a nested
config: its fields are set as ``FIELD_SUBFIELD`` (``former_heads=8`` sets
``heads`` of the field ``former``).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import types
import typing
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Literal, Union


def setting(default: Any = MISSING, *, default_factory: Any = MISSING,
            ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None,
            record: bool = True) -> Any:
    """A config field with a range (``ge``: at least, ``gt``: above, ``le``:
    at most, ``lt``: below) checked for numbers, and whether runs
    ``record`` it (:obj:`False` for what does not change a result, such as
    where the data are read from). A subclass that only changes the default
    (``hidden: int = 100``) keeps the range and ``record`` of its base."""
    bounds = {name: value for name, value in
              (('ge', ge), ('gt', gt), ('le', le), ('lt', lt)) if value is not None}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={'bounds': bounds, 'record': record})


@dataclass(frozen=True)
class TaskConfig:
    """Base of the task configs: checks every field's type and range when
    built (subclasses add checks across fields in ``__post_init__``, after
    calling this one)."""

    def __post_init__(self) -> None:
        for field in fields(self):  # a nested config checked its own fields
            check_value(type(self), field.name, getattr(self, field.name),
                        type(self).__name__)


def is_config(hint: Any) -> bool:
    """Whether the type ``hint`` is a nested config (a dataclass)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of every field of the dataclass ``cls``."""
    return typing.get_type_hints(cls)


def field_metadata(cls: type, name: str) -> typing.Mapping[str, Any]:
    """The :func:`setting` metadata of field ``name``, from the nearest class
    of ``cls``'s bases that gives it."""
    for base in cls.__mro__:
        field = getattr(base, '__dataclass_fields__', {}).get(name)
        if field is not None and field.metadata:
            return field.metadata
    return {}


def default_value(cls: type, name: str) -> Any:
    field = cls.__dataclass_fields__[name]
    if field.default_factory is not MISSING:
        return field.default_factory()
    return field.default


def describe_type(hint: Any) -> str:
    """``hint`` in words, as an error message says what a value must be."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return ' or '.join(describe_type(arg) for arg in args)
    if origin is Literal:
        return ' or '.join(repr(arg) for arg in args)
    if origin is dict:
        return f'a dict {{{describe_type(args[0])}: {describe_type(args[1])}}}'
    return {bool: 'True or False', int: 'an integer', float: 'a number',
            str: 'a string', type(None): 'None'}.get(
                hint, getattr(hint, '__name__', str(hint)))


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (an int is a number, a bool
    is no integer)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if origin is Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin is dict:
        return isinstance(value, dict) and all(
            matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint)


def describe_bounds(bounds: typing.Mapping[str, float]) -> str:
    low = ('[', bounds['ge']) if 'ge' in bounds else (
        ('(', bounds['gt']) if 'gt' in bounds else None)
    high = (']', bounds['le']) if 'le' in bounds else (
        (')', bounds['lt']) if 'lt' in bounds else None)
    if low and high:
        return f'in {low[0]}{low[1]}, {high[1]}{high[0]}'
    if low:
        return f"{'at least' if low[0] == '[' else 'above'} {low[1]}"
    if high:
        return f"{'at most' if high[0] == ']' else 'below'} {high[1]}"
    return ''


def within(value: float, bounds: typing.Mapping[str, float]) -> bool:
    return (value >= bounds.get('ge', value) and value <= bounds.get('le', value)
            and ('gt' not in bounds or value > bounds['gt'])
            and ('lt' not in bounds or value < bounds['lt']))


def check_value(cls: type, name: str, value: Any, owner: str,
                key: str | None = None) -> None:
    """Raise :class:`ValueError` unless ``value`` has the type and range of
    field ``name`` of ``cls`` (``key``: the option's name in the message)."""
    hint = field_types(cls)[name]
    bounds = field_metadata(cls, name).get('bounds', {})
    expected = describe_type(hint)
    in_range = describe_bounds(bounds)
    if not matches(value, hint):
        error = expected + (f', {in_range}' if in_range else '')
    elif (in_range and isinstance(value, (int, float))
          and not isinstance(value, bool) and not within(value, bounds)):
        error = in_range
    else:
        return
    raise ValueError(f"{owner} option {key or name}={value!r} must be {error} "
                     f"(default: {default_value(cls, name)!r})")


def option_names(cls: type) -> dict[str, tuple[str, str | None]]:
    """Every option of the config class ``cls``: ``{key: (field, subfield)}``,
    a nested config's fields as ``FIELD_SUBFIELD``."""
    names: dict[str, tuple[str, str | None]] = {}
    for field in fields(cls):
        names[field.name] = (field.name, None)
        hint = field_types(cls)[field.name]
        if is_config(hint):
            for sub in fields(hint):
                names[f'{field.name}_{sub.name}'] = (field.name, sub.name)
    return names


def check_option(cls: type, key: str, value: Any, owner: str) -> None:
    """Raise :class:`ValueError` unless option ``key`` exists and ``value``
    has its type and range (settings that depend on each other are checked
    when the config is built)."""
    names = option_names(cls)
    if key not in names:
        raise ValueError(f"Unknown {owner} options {[key]}; known: "
                         f"{sorted(names)}")
    name, sub = names[key]
    if sub is None:
        check_value(cls, name, value, owner)
    else:
        check_value(field_types(cls)[name], sub, value, owner, key)


def build_config(cls: type, options: dict[str, Any], owner: str,
                 base: Any = None) -> Any:
    """The config ``cls`` (or ``base``, an instance of it) with ``options``
    set; every option is checked (:func:`check_option`), then the whole.
    Paths (:class:`os.PathLike`) are given as text, as runs record them."""
    options = {key: os.fspath(value) if isinstance(value, os.PathLike) else value
               for key, value in options.items()}
    names = option_names(cls)
    unknown = set(options) - set(names)
    if unknown:
        raise ValueError(f"Unknown {owner} options {sorted(unknown)}; known: "
                         f"{sorted(names)}")
    for key, value in options.items():
        check_option(cls, key, value, owner)
    top = {key: value for key, value in options.items() if names[key][1] is None}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        name, sub = names[key]
        if sub is not None:
            nested.setdefault(name, {})[sub] = value
    if base is not None and not isinstance(base, cls):
        raise TypeError(f"{owner}: 'config' must be a {cls.__name__}, got "
                        f"{type(base).__name__}")
    for name, changes in nested.items():
        inner = top.get(name, getattr(base, name) if base is not None
                        else default_value(cls, name))
        try:
            top[name] = replace(inner, **changes)
        except ValueError as error:
            keys = ', '.join(f'{name}_{sub}' for sub in changes)
            raise ValueError(f"{owner} option {keys}: {error}") from error
    return replace(base, **top) if base is not None else cls(**top)


def flat_options(config: Any, recorded_only: bool = False) -> dict[str, Any]:
    """The options that rebuild ``config`` (:func:`build_config`): every
    field by name, nested configs' fields as ``FIELD_SUBFIELD``; with
    ``recorded_only``, without the fields that do not change a result."""
    options: dict[str, Any] = {}
    for field in fields(config):
        value = getattr(config, field.name)
        if recorded_only and not field_metadata(type(config), field.name).get(
                'record', True):
            continue
        if is_config(type(value)):
            options.update({f'{field.name}_{key}': inner for key, inner in
                            flat_options(value, recorded_only).items()})
        else:
            options[field.name] = value
    return options


def parse_option(cls: type, text: str, owner: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(key, value)``, VALUE read as a Python literal
    (``1e-3``, ``True``, ``{'metric': 2.0}``), or as text where the option
    takes text (``val_source=adobe``); checked with :func:`check_option`."""
    key, sep, text_value = text.partition('=')
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got '{text}'")
    try:
        value = ast.literal_eval(text_value)
    except (ValueError, SyntaxError):
        value = text_value
    try:
        check_option(cls, key, value, owner)
    except ValueError as error:
        if isinstance(value, str):
            raise
        try:  # an option that takes text: '2024' as a folder name
            check_option(cls, key, text_value, owner)
        except ValueError:
            raise error from None
        value = text_value
    return key, value
