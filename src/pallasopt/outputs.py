"""Files pallasopt writes: checked before the work starts, written atomically, with the mode a user expects."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import UsageError


def check_output(path: Path, force: bool, inputs: tuple[Path, ...], option: str = "-o") -> None:
    """Refuse (exit 2) to replace an input or an existing file without `force`, or to write where we cannot."""
    if any(path.resolve() == i.resolve() for i in inputs) and not force:
        raise UsageError(f"refusing to overwrite the input {path}", hint="pass --force to replace it")
    if path.exists() and not force:
        raise UsageError(f"{path} exists", hint=f"pass --force to overwrite it, or choose another {option}")
    check_writable(path, option)


def check_writable(path: Path, option: str) -> None:
    """Raise a one-line `UsageError` now if a file cannot be written at `path` later (probed with a real file)."""
    if path.is_dir():
        raise UsageError(f"{path} is a folder", hint=f"give {option} a file name")
    probe_folder(path.parent, f"cannot write {path}", option)


def check_writable_folder(folder: Path, option: str) -> None:
    """Like `check_writable`, for a folder pallasopt will create (if needed) and fill."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is not a folder", hint=f"give {option} a folder")
    probe_folder(folder, f"cannot write in {folder}", option)


def probe_folder(folder: Path, what: str, option: str) -> None:
    """Create and remove a file in `folder`, or in its nearest existing ancestor (the missing folders below it are
    made when the output is written); a `UsageError` starting with `what` if that fails."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{what}: {folder} is not a folder", hint=f"choose another {option}")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".pallasopt-probe-"):
            pass
    except OSError as e:
        raise UsageError(
            f"{what}: the folder {folder} is not writable ({e.strerror or e})",
            hint=f"choose another {option} or make the folder writable",
        ) from None


def new_file_mode() -> int:
    """The mode `open()` would give a new file: 0o666 minus the process umask."""
    umask = None
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    if umask is None:  # not thread-safe, hence the /proc route first
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, text: str) -> None:
    """Write a file so a reader sees the old or the new content, never half of it.

    The file keeps the permission bits of the file it replaces, else gets those of a newly created file (0644
    under the usual umask), never the private 0600 of the temporary file it is written through.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mode = new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
