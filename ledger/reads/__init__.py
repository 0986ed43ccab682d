"""Reads, always scoped: selectors, the API's shapes, usage and the usage report, sub-run trees."""
