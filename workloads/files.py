"""One wording for an input file that cannot be read because it is not there, or is a folder.

Used wherever a file is expected (a trace, a vLLM result, a scenario, a sweep or baseline
file, an acceptance trace, a price list), so that a folder given by mistake is named as
one rather than reported missing.
"""

from __future__ import annotations

import os
from pathlib import Path


def missing_file(path: str | os.PathLike[str], what: str) -> str:
    """Why ``path`` cannot be read as ``what`` (e.g. ``"trace file"``): a folder, or nothing there."""
    if Path(path).is_dir():
        return f"is a folder, not {'an' if what[0] in 'aeiou' else 'a'} {what}"
    return f"no such {what}"
