"""Text cells of the CSV exports, made safe to open in a spreadsheet (docs/security.md "CSV").

A cell that begins with `=`, `+`, `-` or `@` (or a tab or carriage return, which some spreadsheets
skip before reading a formula) is taken for a formula by Excel, LibreOffice and Sheets:
`=HYPERLINK(…)` in a model name recorded by any ingest key would run in the auditor's
spreadsheet. Such a cell is written with a leading `'` (OWASP's advice), which spreadsheets show
as text and hide. Numbers the exports write themselves are not text cells and are left alone.

The data exports (ledger/interop/exports.py) must also be read back exactly, so that `ledger verify
--export` recomputes event ids from a CSV file: there a cell that itself begins with `'` gets one
more, and `read_cell` drops exactly one leading `'` (`reversible_cell` / `read_cell` round-trip
every string).
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def text_cell(value: str) -> str:
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def reversible_cell(value: str) -> str:
    return "'" + value if value.startswith(FORMULA_STARTS) or value.startswith("'") else value


def read_cell(cell: str) -> str:
    return cell[1:] if cell.startswith("'") else cell
