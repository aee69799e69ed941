"""The files onnxfuse reads and writes besides models: the one atomic writer of reports and summaries
(:func:`write_atomically`), and the small files that options name (``--baseline OLD.json``): regular files of
bounded size only.

Such a file may come from elsewhere (a CI job downloads the baseline from an earlier run), so it is checked before
a byte is read: a FIFO would block the read forever, a device such as ``/dev/zero`` or ``/dev/urandom`` never ends,
and a huge file would fill memory. The checks run on the opened file descriptor (``fstat``), so that a path swapped
for a FIFO between a check and the open cannot get past them; the open itself uses ``O_NONBLOCK``, which keeps
opening a FIFO from waiting for a writer (POSIX ``open``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from onnxfuse.errors import InputError


def read_option_file(path: str | os.PathLike, option: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` that option ``option`` names.

    Args:
        path: the file.
        option: the option as the user wrote it (``--baseline``), for messages.
        max_bytes: largest file accepted, in bytes.

    Raises:
        InputError: one line naming the option and the file: it does not exist or cannot be opened, is not a
            regular file (a folder, FIFO, socket or device), or is larger than ``max_bytes``.
    """
    given = Path(path)
    try:
        fd = os.open(given, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{option} {given}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{option} {given}: not a regular file (a folder, FIFO, socket or device)")
        if info.st_size > max_bytes:
            raise InputError(f"{option} {given}: {info.st_size} bytes, larger than the {max_bytes} bytes accepted")
        chunks, total = [], 0
        while True:  # a file that grows while it is read still stops at max_bytes + 1
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise InputError(f"{option} {given}: larger than the {max_bytes} bytes accepted")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{option} {given}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def shown_path(path: str | os.PathLike) -> str:
    """How an artifact (a report, a batch summary) names a file: as given when relative, relative to the working
    folder when inside it, else by its file name alone, so that no absolute path of the machine that made the
    artifact is in it."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        return os.path.relpath(p) if p.is_relative_to(Path.cwd()) else p.name
    except (OSError, ValueError):
        return p.name


def write_atomically(path: str | os.PathLike, data: bytes | str) -> None:
    """Replace ``path`` by a file holding ``data`` (a ``str`` is written as UTF-8), or leave it as it was: the
    bytes go to a temporary file in the same folder, which gets the permissions of a new file (0o666 less the
    umask) and is moved onto ``path`` with ``os.replace`` (atomic on POSIX). No temporary file is left behind, also
    on Ctrl-C. Models have their own writer (:func:`onnxfuse.model.io.save_model`: a model may come with a data
    file, committed by the same rule).

    Raises:
        OSError: the folder takes no new file, or the write or the rename failed (callers word the message).
    """
    target = Path(path)
    # the temporary file goes where the path leads (through symbolic links), so that the rename stays in one
    # file system; the rename replaces ``path`` itself (a link to a file becomes the new file)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".tmp", dir=target.resolve().parent)
    replaced = False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        replaced = True
    finally:
        if not replaced:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
