"""Files written so that nothing is lost: a temporary file beside the target, flushed and
synced, then put in place by an atomic ``os.replace``. A run that dies half way leaves the
old file as it was (and at worst a hidden ``.NAME.*.tmp`` beside it).

Every failure to use a path becomes BadInput naming the path, for the command line to
print as one ``error:`` line.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, IO

from .errors import BadInput


def why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def target(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` (symbolic links followed) if a regular file can be written there: refuses a
    directory, a device or another special file, and a path under a file."""
    p = Path(os.path.realpath(path))
    if p.is_dir():
        raise BadInput(f"{what} {path} is a directory")
    if p.exists() and not p.is_file():
        raise BadInput(f"{what} {path} is not a regular file")
    parent = existing_ancestor(p.parent)
    if not parent.is_dir():
        raise BadInput(f"{what} {path} cannot be created: {parent} is not a directory")
    return p


def existing_ancestor(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def probe(path: str | os.PathLike, what: str = "file") -> Path:
    """``target(path)``, and a temporary file created and removed in its folder (or the
    nearest one that exists), so an unwritable place is refused before any work."""
    p = target(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=existing_ancestor(p.parent), prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise BadInput(f"{what} {path} cannot be written: {why(e)}") from None
    return p


def make_dir(path: str | os.PathLike, what: str = "folder") -> Path:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{what} {path} cannot be created: {why(e)}") from None
    if not p.is_dir():
        raise BadInput(f"{what} {path} is not a directory")
    return p


class Temp:
    """An open temporary file beside ``path``; ``place()`` syncs it and renames it over
    ``path`` (the open file then is ``path``); ``discard()`` removes it if not placed."""

    def __init__(self, path: str | os.PathLike, binary: bool = False, what: str = "file"):
        self.path, self.what = target(path, what), what
        self.shown = str(path)
        make_dir(self.path.parent, what=f"folder of {what} {path}")
        mode = self.path.stat().st_mode & 0o7777 if self.path.exists() else _default_mode()
        try:
            fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            os.chmod(self.tmp, mode)
            self.f: IO = os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""}))
        except OSError as e:
            raise BadInput(f"{what} {path} cannot be written: {why(e)}") from None
        self.placed = False

    def sync(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def place(self) -> None:
        try:
            self.sync()
            os.replace(self.tmp, self.path)
            sync_dir(self.path.parent)
        except OSError as e:
            self.discard()
            raise BadInput(f"{self.what} {self.shown} cannot be written: {why(e)}") from None
        self.placed = True

    def discard(self) -> None:
        if not self.f.closed:
            self.f.close()
        if not self.placed and os.path.exists(self.tmp):
            os.unlink(self.tmp)


def write_atomically(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = False,
                     what: str = "file") -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, then replace ``path`` by it."""
    t = Temp(path, binary=binary, what=what)
    try:
        write(t.f)
        t.place()
    except OSError as e:
        raise BadInput(f"{what} {path} cannot be written: {why(e)}") from None
    finally:
        t.discard()
    return t.path


def sync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of a regular file; BadInput naming it when missing, not a regular
    file, unreadable or not text."""
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{what} {path} does not exist")
    if p.is_dir():
        raise BadInput(f"{what} {path} is a directory")
    if not p.is_file():
        raise BadInput(f"{what} {path} is not a regular file")
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise BadInput(f"{what} {path} cannot be read: {why(e)}") from None
