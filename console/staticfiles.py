"""Static file names: content-hashed once collected, plain before."""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage  # type: ignore[import-untyped]  # whitenoise ships no types


class StaticStorage(CompressedManifestStaticFilesStorage):
    """WhiteNoise's compressed, hashed storage, for a process that finds no manifest (no
    collectstatic ran: `make run`, the tests, a DEBUG=0 start without `make serve`) naming files by
    their plain names, which WhiteNoise serves from the finders, rather than failing every page on
    a missing manifest entry. With DEBUG on, Django names them plainly anyway."""

    def stored_name(self, name: str) -> str:
        if not self.hashed_files:
            return name
        return super().stored_name(name)
