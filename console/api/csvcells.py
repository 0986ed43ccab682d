"""Text cells of the CSV exports, made safe to open in a spreadsheet: the rule lives in
ledger/interop/csvcells.py, shared with the command line's exports."""

from __future__ import annotations

from ledger.interop.csvcells import FORMULA_STARTS, text_cell

__all__ = ["FORMULA_STARTS", "text_cell"]
