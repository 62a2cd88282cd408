"""Reading ``params.yaml``: one frozen dataclass per section, checked whole before a stage does any work.

Invariants:
- ``params.yaml`` is the only place a default lives. A section's dataclass fields have no defaults, so a key
  missing from the file is an error naming it, and code and file can never drift apart.
- Every key is checked, at every depth (nested sections, per-source entries): an unknown key fails naming itself
  and the keys valid there, so a misspelt ``dedup.near.treshold`` can never be silently ignored.
- Values are checked against the field's type (``Literal`` choices included) before ``validate`` checks ranges.
- Keys of per-item entries (one per source) may be left out only where a field is declared with :func:`optional`;
  leaving one out means null, nothing else.
- Each stage reads only the sections its ``dvc.yaml`` entry declares under ``params``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from draftline.core.errors import Refusal

PARAMS_FILE = Path(os.environ.get("DRAFTLINE_PARAMS", "params.yaml"))

P = TypeVar("P", bound="Params")


class ParamsError(Refusal, ValueError):
    """A params.yaml value that cannot be used; the message names the key and what to write instead."""


def optional() -> Any:
    """A field of a per-item entry that params.yaml may leave out (read as null)."""
    return dataclasses.field(default=None, metadata={"optional": True})


def load_section(name: str, path: str | os.PathLike = PARAMS_FILE) -> Any:
    """The raw value of one top-level section of ``path``; a missing section is a clear error."""
    with open(path, encoding="utf-8") as f:
        params = yaml.safe_load(f) or {}
    if name not in params:
        raise ParamsError(f"{path} has no section {name!r}; add it (every section is described in params.yaml)")
    return params[name]


def load_value(dotted: str, hint: Any, path: str | os.PathLike = PARAMS_FILE) -> Any:
    """One key of another stage's section (``generate.enable_thinking``), checked against ``hint``.

    For the few settings two stages must agree on; the stage's ``dvc.yaml`` entry names the same dotted key.
    """
    section, *keys = dotted.split(".")
    value = load_section(section, path)
    for i, key in enumerate(keys):
        if not isinstance(value, Mapping) or key not in value:
            raise ParamsError(f"params.yaml has no {'.'.join([section, *keys[: i + 1]])}; add it")
        value = value[key]
    return _value(hint, value, dotted)


class Params:
    """Base of the section dataclasses: ``Section.load("section")`` or ``Section.parse(values, "where")``."""

    @classmethod
    def load(cls: type[P], section: str, path: str | os.PathLike = PARAMS_FILE) -> P:
        return cls.parse(load_section(section, path), section)

    @classmethod
    def parse(cls: type[P], values: Any, where: str) -> P:
        if not isinstance(values, Mapping):
            raise ParamsError(f"params.yaml: {where} must be a mapping of keys, not {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ParamsError(f"params.yaml: {where} has unknown key(s) {unknown}; valid keys: {sorted(fields)}")
        missing = [n for n, f in fields.items() if n not in values and not f.metadata.get("optional")]
        if missing:
            raise ParamsError(f"params.yaml: {where} lacks key(s) {missing}; add them (see the comments in params.yaml)")
        hints = get_type_hints(cls)
        obj = cls(**{n: _value(hints[n], values.get(n), f"{where}.{n}") for n in fields})
        obj.validate(where)
        return obj

    def validate(self, where: str) -> None:
        """Checks across keys or of ranges; raise :class:`ParamsError` naming ``where``. Nothing by default."""


def _value(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked against the type ``hint``, nested sections parsed; raises :class:`ParamsError`."""
    origin = get_origin(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Params):
        return hint.parse(value, where)
    if origin in (Union, types.UnionType):
        arms = get_args(hint)
        if value is None and type(None) in arms:
            return None
        errors = []
        for arm in (a for a in arms if a is not type(None)):
            try:
                return _value(arm, value, where)
            except ParamsError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else ParamsError(f"params.yaml: {where} must be {_describe(hint)}, not {value!r}")
    if origin is Literal:
        if value not in get_args(hint):
            raise ParamsError(f"params.yaml: {where} must be one of {list(get_args(hint))}, not {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"params.yaml: {where} must be a list, not {value!r}")
        (item,) = get_args(hint) or (Any,)
        return [_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(value, Mapping):
            raise ParamsError(f"params.yaml: {where} must be a mapping, not {value!r}")
        _, item = get_args(hint) or (str, Any)
        return {str(k): _value(item, v, f"{where}.{k}") for k, v in value.items()}
    return _scalar(hint, value, where)


def _scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: params fields of type {hint!r} are not supported")
    if not ok:
        raise ParamsError(f"params.yaml: {where} must be {_describe(hint)}, not {value!r}")
    return value


def _describe(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if get_origin(hint) is list:
        return "a list"
    return names.get(hint, getattr(hint, "__name__", str(hint)))
