"""Reading a user-named text file with one-line errors (missing, directory, permissions, binary, gzip), and
replacing a small state file atomically."""
from __future__ import annotations

import gzip
from pathlib import Path

from fleetcanary.core import statefile


class TextFileError(Exception):
    """The file cannot be read as text; the message is one line starting with the path."""


def read_text(path: str | Path) -> str:
    """The file's text (UTF-8); a `.gz` file is decompressed."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return fh.read()
        return path.read_text(encoding="utf-8")
    except (gzip.BadGzipFile, EOFError):
        raise TextFileError(f"{path}: not a gzip file (or truncated)") from None
    except FileNotFoundError:
        raise TextFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TextFileError(f"{path}: is a directory") from None
    except PermissionError:
        raise TextFileError(f"{path}: permission denied") from None
    except UnicodeDecodeError:
        raise TextFileError(f"{path}: not UTF-8 text (binary file?)") from None
    except OSError as exc:
        raise TextFileError(f"{path}: {exc.strerror or exc}") from None


def write_atomic(path: str | Path, text: str) -> None:
    """Replace the file's content in one step (core/statefile.py: an exclusive O_NOFOLLOW temporary beside it,
    fsynced, then a rename), so a crash leaves the old content or the new, never half, and a planted link is
    never written through. OSError propagates."""
    statefile.write_atomic(path, text)
