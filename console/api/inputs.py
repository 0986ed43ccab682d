"""Request bodies: every field of every write endpoint takes exactly the JSON type its schema
names (docs/api.md § Conventions, "JSON types").

DRF's fields convert what they are given: a CharField writes the number 5 as "5", an
IntegerField reads "2", a BooleanField reads "yes". Converted, a client's typo reached the log
and the audit as a value nobody sent (a share link's `includeSubRuns: "yes"` widened what it
shows). `Input`, the base of every request serializer under /api/v1/, checks the types first,
from each field's class, and refuses a wrong one with 400 `invalid_request` before any field
converts anything: `details.fields` names each, `details.field` the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# JSON's names for Python's decoded values, in messages.
_JSON_NAMES: list[tuple[type | tuple[type, ...], str]] = [
    (bool, "a boolean"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
]


def _json_name(value: Any) -> str:
    for kind, name in _JSON_NAMES:
        if isinstance(value, kind):
            return name
    return "null"


def _wrong(expected: str, value: Any) -> list[str]:
    return [f"must be {expected}, not {_json_name(value)}"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_errors(field: serializers.Field, value: Any) -> Any:
    """What is wrong with the JSON type of `value` for `field` (and of what it holds, for arrays,
    objects and nested serializers), shaped as DRF's own errors; None when nothing is. A null is
    left to the field (`allow_null`), as is anything a JSONField takes."""
    if value is None or isinstance(field, serializers.JSONField):
        return None
    if isinstance(field, FencingToken):
        integer = isinstance(value, int) and not isinstance(value, bool)
        return None if integer or isinstance(value, str) else _wrong("an integer or a string", value)
    if isinstance(field, serializers.ListSerializer):
        if not isinstance(value, list):
            return _wrong("an array", value)
        assert field.child is not None  # many=True always makes one
        return _items(field.child, enumerate(value))
    if isinstance(field, serializers.Serializer):
        if not isinstance(value, dict):
            return _wrong("an object", value)
        return fields_errors(field, value)
    if isinstance(field, serializers.ListField | serializers.MultipleChoiceField):
        if not isinstance(value, list):
            return _wrong("an array", value)
        child = getattr(field, "child", None)
        if child is None:  # the choices of a MultipleChoiceField: strings
            return {str(i): _wrong("a string", v) for i, v in enumerate(value) if not isinstance(v, str)} or None
        return _items(child, enumerate(value))
    if isinstance(field, serializers.DictField):
        if not isinstance(value, dict):
            return _wrong("an object", value)
        return _items(field.child, value.items())
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else _wrong("a boolean (true or false)", value)
    if isinstance(field, serializers.IntegerField):
        # JSON Schema's integer: a number without a fractional part (2.0 is 2); DRF refuses 2.5.
        return None if _is_number(value) else _wrong("an integer", value)
    if isinstance(field, serializers.FloatField | serializers.DecimalField):
        return None if _is_number(value) else _wrong("a number", value)
    if isinstance(field, serializers.CharField | serializers.ChoiceField | serializers.DateTimeField):
        return None if isinstance(value, str) else _wrong("a string", value)
    raise TypeError(f"{type(field).__name__} has no JSON type in console.api.inputs: name one")


def _items(child: serializers.Field, items: Any) -> dict[str, Any] | None:
    errors = {str(key): found for key, item in items if (found := type_errors(child, item)) is not None}
    return errors or None


def fields_errors(serializer: serializers.Serializer, data: Mapping[str, Any]) -> dict[str, Any] | None:
    errors = {
        name: found
        for name, field in serializer.fields.items()
        if not field.read_only and name in data and (found := type_errors(field, data[name])) is not None
    }
    return errors or None


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string"}]})
class FencingToken(serializers.CharField):
    """A run lease's fencing token: the integer the lease gave, or its digits as a string (the
    log's rule compares them as text, ledger.log.rules.check_fencing)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, max_length=40, **kwargs)


class Input(serializers.Serializer):
    """A request body: its fields' JSON types are checked before DRF converts any of them."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            errors = fields_errors(self, data)
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)
