"""A task's data file read as text, checked before it is trusted: a regular file (not a folder, a device
or a pipe, which would hang a read), gzip-compressed exactly when it is named `.gz`, and UTF-8 text
without NUL bytes. Every problem is one HarnessError naming the file (and the byte offset and line of a
bad byte), so a damaged file stops a run before the model is loaded, never with a traceback."""

from __future__ import annotations

import gzip
import stat
import zlib
from pathlib import Path

from core.types import HarnessError

GZIP_MAGIC = b"\x1f\x8b"
KINDS = {
    stat.S_ISDIR: "a folder",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a named pipe",
    stat.S_ISSOCK: "a socket",
}


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it is named `.gz`."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise HarnessError(f"data file not found: {path}") from None
    except OSError as exc:
        raise HarnessError(f"data file {path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KINDS.items() if test(mode)), "not a regular file")
        raise HarnessError(f"data file {path} is {kind}: give a file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise HarnessError(f"data file {path} cannot be read ({exc.strerror})") from None
    gzipped = raw.startswith(GZIP_MAGIC)
    if path.suffix == ".gz" and not gzipped:
        raise HarnessError(
            f"data file {path} is named .gz but is not gzip-compressed: rename or recompress it"
        )
    if not gzipped:
        return raw
    if path.suffix != ".gz":
        raise HarnessError(f"data file {path} is gzip-compressed: name it {path.name}.gz")
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or corrupt archive
        raise HarnessError(f"data file {path} is a damaged gzip archive ({exc})") from None


def read_text(path: Path) -> str:
    """The file as UTF-8 text (a byte-order mark is dropped)."""
    data = read_bytes(path)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise HarnessError(
            f"data file {path} holds a NUL byte at offset {nul} (line {_line(data, nul)}): a binary file, "
            "not text"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HarnessError(
            f"data file {path} is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"(line {_line(data, exc.start)}); save it as UTF-8"
        ) from None


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1
