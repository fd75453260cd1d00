"""One error type for every bad input, so the CLI can answer with one clear line."""

from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """Bad user input: names the field, the source (file or flag) and the line when known."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        source: str | Path | None = None,
        line: int | None = None,
    ) -> None:
        self.message = message
        self.field = field
        self.source = str(source) if source is not None else None
        self.line = line
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.source:
            where = self.source if self.line is None else f"{self.source}:{self.line}"
            where += ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"
