"""Sealed cursors: the position after a page's last row, encrypted and authenticated, so that a
client can hand it back and can neither read nor make one (docs/security.md § What ids and cursors
reveal).

A position holds row ids (primary keys), which count every tenant's rows: in the clear, two cursors
a day apart told any tenant how much everyone wrote meanwhile, and a forged one was an oracle for
the ids of its own rows. Sealed, a cursor is `base64url(AES-SIV(key, padded position))` with the
list's kind and the workspace, run or tenant it lists as associated data: every position that
holds a row id seals to the same length, a cursor of another list, workspace, run or tenant fails
to open (400 `invalid_cursor`, never another tenant's rows), and so does any change to one.

AES-SIV (RFC 5297, `cryptography`'s AESSIV): deterministic and without a nonce, so there is no
nonce to repeat however many cursors are made; the same position of the same list gives the same
cursor, which says nothing a client does not know. The key is derived (HKDF-SHA256) from
SECRET_KEY; a cursor made under a key in SECRET_KEY_FALLBACKS still opens, so rotating the key
does not break a page a client is reading. One seal or open per page, never per row.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db.models import Model
from django.utils.encoding import force_bytes

from ledger import limits

# Positions are padded to a multiple of this many bytes (JSON allows trailing blanks). Every
# position that holds a row id is shorter (the longest, a runs list sorted by cost, is under 90
# bytes), so the length of a cursor never tells how many digits its row id has.
BLOCK = 96
# Far more than any position we make (a dataset's name is at most 100 characters): anything
# longer is not ours, and is refused before any work is done on it.
MAX_LENGTH = 2048
_CONTEXT = b"runledger cursor v1"


class NotOurs(ValueError):
    """A cursor that does not open with this list's key: forged, changed, cut short, or another
    list's, workspace's, run's or tenant's."""


@functools.lru_cache(maxsize=16)
def _cipher(secret: bytes) -> AESSIV:
    key = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=_CONTEXT).derive(secret)
    return AESSIV(key)  # 512 bits: AES-256 in SIV mode


def _secrets() -> list[bytes]:
    return [force_bytes(settings.SECRET_KEY), *(force_bytes(k) for k in settings.SECRET_KEY_FALLBACKS)]


def _associated(kind: str, scope: Model, query: str) -> list[bytes]:
    associated = [_CONTEXT, kind.encode(), f"{scope._meta.label_lower}:{scope.pk}".encode()]
    # Only a filtered list adds its query: an unfiltered list's cursors are those made before.
    return [*associated, query.encode("utf-8", "surrogatepass")] if query else associated


def seal(position: dict[str, Any] | bytes, *, kind: str, scope: Model, query: str = "") -> str:
    """The cursor of `position` (a JSON object, or its text) for the list `kind` of `scope`: the
    workspace it lists, the run (a run's own list), or the tenant (a tenant-wide list); and, for a
    filtered list, `query`, its filters and order as they were asked (`status=failed`), so that a
    cursor of one filter does not open under another."""
    if not isinstance(position, bytes):
        position = json.dumps(position, separators=(",", ":"), ensure_ascii=False).encode()
    padded = position.ljust(BLOCK * max(1, -(-len(position) // BLOCK)))
    sealed = _cipher(_secrets()[0]).encrypt(padded, _associated(kind, scope, query))
    return base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def unseal(raw: str, *, kind: str, scope: Model, query: str = "") -> Any:
    """The position a cursor of this list holds, as JSON (depth-limited: it was ours, but a key can
    leak); NotOurs when it is not one this list gave out."""
    if len(raw) > MAX_LENGTH or not raw.isascii():
        raise NotOurs("not a cursor")
    try:
        sealed = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise NotOurs("not a cursor") from None
    associated = _associated(kind, scope, query)
    for secret in _secrets():
        try:
            position = _cipher(secret).decrypt(sealed, associated)
        except (InvalidTag, ValueError):  # ValueError: shorter than the 16-byte tag
            continue
        try:
            return limits.loads(position)
        except ValueError:
            raise NotOurs("not a position") from None
    raise NotOurs("not a cursor of this list")
