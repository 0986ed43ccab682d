"""Query parameters: sealed cursors for lists (`?limit=`, default 50, max 500, and
`?cursor=<next>`), integers and dates, each refused with a 400 that names it."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import Model
from rest_framework.request import Request

from ledger import limits
from ledger.errors import LedgerError

from .. import cursors

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class InvalidCursor(LedgerError):
    code = "invalid_cursor"


class InvalidParameter(LedgerError):
    code = "invalid_parameter"


def int_param(request: Request, name: str, default: int, *, minimum: int = 0, maximum: int = limits.MAX_ROW_ID) -> int:
    """An integer query parameter; at most a bigint unless less is asked (the database's
    integers are 64-bit: a larger one would overflow in the query, not be "not found")."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidParameter(f"{name} must be an integer", parameter=name) from None
    if not minimum <= value <= maximum:
        raise InvalidParameter(f"{name} must be between {minimum} and {maximum}", parameter=name)
    return value


def limit_param(request: Request) -> int:
    return int_param(request, "limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)


def list_query(request: Request, *names: str) -> str:
    """The filters and order a list was asked with, of the parameters `names`, in one canonical
    form: what its cursors are sealed with, so a cursor opens only under the query that made it."""
    return urlencode(sorted((name, value) for name in names if (value := request.query_params.get(name))))


def encode_cursor(position: dict[str, Any], *, kind: str, scope: Model, query: str = "") -> str:
    """`next` for the list `kind` of `scope` (the workspace, run or tenant it lists) asked with
    `query` (list_query): the position sealed (console/cursors.py), so it shows no row id and
    opens for this list, so filtered, only."""
    return cursors.seal(position, kind=kind, scope=scope, query=query)


def decode_cursor(request: Request, *, kind: str, scope: Model, query: str = "") -> dict[str, Any] | None:
    """The position `?cursor=` holds, if it is one `encode_cursor` made for this list of this
    scope and query; else 400 `invalid_cursor` (forged, changed, cut short, another list's,
    tenant's or filter's)."""
    raw = request.query_params.get("cursor")
    if not raw:
        return None
    try:
        value = cursors.unseal(raw, kind=kind, scope=scope, query=query)
    except cursors.NotOurs:
        raise InvalidCursor("cursor is not one this API gave out") from None
    if not isinstance(value, dict):
        raise InvalidCursor("cursor is not one this API gave out")
    return value


def keyset_cursor(request: Request, *, kind: str, scope: Model, query: str = "") -> tuple[datetime, int] | None:
    """A `{t, id}` cursor as (time, row id), refused unless both are in range (no Infinity or NaN,
    no id past a bigint, no time off the calendar)."""
    cursor = decode_cursor(request, kind=kind, scope=scope, query=query)
    if cursor is None:
        return None
    try:
        return limits.keyset_position(cursor)
    except (ValueError, TypeError, OverflowError):
        raise InvalidCursor("cursor is not one this API gave out") from None


def row_cursor(request: Request, key: str, *, kind: str, scope: Model, query: str = "") -> int:
    """A cursor holding one row id or offset under `key` (0 without a cursor)."""
    cursor = decode_cursor(request, kind=kind, scope=scope, query=query)
    if cursor is None:
        return 0
    try:
        return limits.row_id(cursor.get(key))
    except ValueError:
        raise InvalidCursor("cursor is not one this API gave out") from None


def date_param(request: Request, name: str, default: date) -> date:
    """A day YYYY-MM-DD between ledger.limits.FIRST_DAY and LAST_DAY: ranges add and subtract days,
    and the calendar's own edges would overflow."""
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        day = date.fromisoformat(raw) if len(raw) == 10 else _bad_date(name)
    except ValueError:
        return _bad_date(name)
    return day if limits.day_in_range(day) else _bad_date(name)


def _bad_date(name: str) -> date:
    raise InvalidParameter(
        f"{name} must be a date YYYY-MM-DD from {limits.FIRST_DAY} to {limits.LAST_DAY}", parameter=name
    )
