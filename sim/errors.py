"""One error type for every bad input, so the CLI can answer with one clear line."""

from __future__ import annotations

from pathlib import Path

from workloads.files import missing_file

__all__ = ["InputError", "missing_file", "read_text"]


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


def read_text(path: str | Path, *, field: str | None = None) -> str:
    """A file's text, read as UTF-8 (a BOM is dropped); anything else is one InputError naming the
    line of the first byte that is not UTF-8, so no input is ever guessed at in another encoding."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at byte {exc.start}); "
                         "save the file as UTF-8", field=field, source=path, line=line) from None
    return text
