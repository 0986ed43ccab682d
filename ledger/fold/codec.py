"""Copies and JSON for the fold's records, driven by their dataclass type hints.

A keyed collection (dict of records) is stored as a list, because a jsonb column does not keep
key order; on the way back, each record's first field is its key. Money is a decimal string so
a stored state round-trips exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from decimal import Decimal
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@cache
def _hints(cls: Any) -> dict[str, Any]:
    return get_type_hints(cls)


@cache
def _plan(cls: Any) -> tuple[tuple[str, str, str, Any], ...]:
    """(field, JSON key, kind, record class) per field; kind is money|record|keyed|records|json."""
    plan = []
    for f in fields(cls):
        if not f.compare:
            continue  # not the fold's (RunState.payload_bytes, a cache): neither compared nor stored
        hint = _hints(cls)[f.name]
        if get_origin(hint) in (Union, UnionType):
            present = [a for a in get_args(hint) if a is not NoneType]
            hint = present[0] if len(present) == 1 else Any
        origin, args = get_origin(hint), get_args(hint)
        if hint is Decimal:
            kind, item = "money", None
        elif _is_dataclass_type(hint):
            kind, item = "record", hint
        elif origin is dict and _is_dataclass_type(args[1]):
            kind, item = "keyed", args[1]
        elif origin is list and _is_dataclass_type(args[0]):
            kind, item = "records", args[0]
        else:
            kind, item = "json", None
        plan.append((f.name, _camel(f.name), kind, item))
    return tuple(plan)


@cache
def keyed_fields(cls: Any) -> frozenset[str]:
    return frozenset(name for name, _, kind, _ in _plan(cls) if kind == "keyed")


@cache
def _container_fields(cls: Any) -> tuple[tuple[str, str], ...]:
    return tuple(
        (name, kind)
        for name, _, kind, _ in _plan(cls)
        if kind in ("keyed", "records") or get_origin(_hints(cls)[name]) is list
    )


def _is_dataclass_type(hint: Any) -> bool:
    return isinstance(hint, type) and is_dataclass(hint)


def clone(record: Any) -> Any:
    """Copy the records and their containers; share the JSON values inside them.

    The fold replaces JSON values (outputs, args, manifests) and never edits them in place, so
    sharing them is safe and makes an incremental fold cost a fraction of a deepcopy.
    """
    copied = copy.copy(record)
    cls: Any = type(record)
    for name, kind in _container_fields(cls):
        value = getattr(record, name)
        if kind == "keyed":
            setattr(copied, name, {key: clone(item) for key, item in value.items()})
        elif kind == "records":
            setattr(copied, name, [clone(item) for item in value])
        else:
            setattr(copied, name, list(value))
    return copied


def _copy_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value


def dump(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cls: Any = type(record)
    for name, key, kind, _ in _plan(cls):
        value = getattr(record, name)
        if value is None:
            out[key] = None
        elif kind == "money":
            out[key] = f"{value.normalize():f}"
        elif kind == "record":
            out[key] = dump(value)
        elif kind == "keyed":
            out[key] = [dump(item) for item in value.values()]
        elif kind == "records":
            out[key] = [dump(item) for item in value]
        else:
            out[key] = _copy_json(value)
    return out


def load(cls: Any, data: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name, key, kind, item_cls in _plan(cls):
        if key not in data:
            continue
        value = data[key]
        if value is None:
            kwargs[name] = None
        elif kind == "money":
            kwargs[name] = Decimal(str(value))
        elif kind == "record":
            kwargs[name] = load(item_cls, value)
        elif kind == "keyed":
            key_field = fields(item_cls)[0].name
            items = [load(item_cls, item) for item in value]
            kwargs[name] = {getattr(item, key_field): item for item in items}
        elif kind == "records":
            kwargs[name] = [load(item_cls, item) for item in value]
        else:
            kwargs[name] = _copy_json(value)
    return cls(**kwargs)
