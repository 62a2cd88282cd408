"""How a merge puts a shard file that already exists (the base's, or the new rows', when none of its rows was
dropped) into the merged folder byte-identical: a reflink, a hardlink or a copy (``merge.carry``).

Shards are immutable: nothing in draftline writes into an existing shard (writers write a temporary name, then
rename), and neither does DVC: ``dvc checkout`` removes a workspace file before it links or copies the cached one
(``dvc_data.hashfile.checkout._relink``), and a copy goes to a temporary name that then replaces the path
(``dvc_objects.fs.local.LocalFileSystem.put_file``). So a second name for a shard file is safe for as long as
nobody writes into a file in place; where the file is also a DVC cache object, such a write would corrupt the
cache (root ignores DVC's read-only mode), which is the risk DVC's own link cache types take for every file.

``auto`` therefore takes, per file (each with its own prompt-key sidecar):

1. a reflink (``FICLONE``: btrfs, XFS, ...): copy-on-write, instant, always safe;
2. else a hardlink. Under a copy cache (DVC's default ``reflink,copy`` on ext4) the cache holds its own copy of
   every file, and ``dvc commit`` replaces the linked output by a copy from it (``_needs_relink``: a copy wants one
   link). Under a link cache (this project's ``.dvc/config``: ``hardlink,symlink,copy``)
   the base's files are cache objects already and DVC links the merged folder to the same objects on commit: a copy
   made here would be thrown away right after, so the hardlink adds no name DVC would not add itself;
3. else (the link failed: another filesystem, another owner, ``fs.protected_hardlinks``) a copy.

Every shard of the merged folder is made read-only (0444, :func:`make_read_only`) once the merge is accepted: a
hardlink shares its mode with the base's file, which is then read-only too. That stops in-place writes by users
other than root.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger

log = get_logger(__name__)

CARRY_MODES = ("auto", "reflink", "hardlink", "copy")
# Linux ioctl that clones a file's extents (copy-on-write) on btrfs, XFS and other reflink filesystems.
_FICLONE = 0x40049409
# What a link that the filesystem (or its owner rules) refuses raises; anything else is a real error.
_UNSUPPORTED = {
    errno.EXDEV,
    errno.EPERM,
    errno.EACCES,
    errno.EMLINK,
    errno.ENOTSUP,
    errno.ENOTTY,
    errno.EINVAL,
    errno.ENOSYS,
}
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class CarryError(OSError, Refusal):
    """``merge.carry: reflink`` or ``hardlink`` where the filesystem (or the files' owner) refuses that link: the
    message names the mode to use instead."""


def make_read_only(path: Path) -> None:
    """Mode 0444; a hardlinked file owned by someone else keeps its mode (not ours to change)."""
    try:
        os.chmod(path, READ_ONLY)
    except PermissionError:
        log.debug("could not make %s read-only (not its owner)", path)


class Carrier:
    """Carries shard files into one merged folder in ``mode`` (``merge.carry``), and records how."""

    def __init__(self, mode: str):
        if mode not in CARRY_MODES:
            raise ValueError(f"merge.carry must be one of {CARRY_MODES}, not {mode!r}")
        self.mode = mode
        self.used: set[str] = set()

    def carry(self, src: Path, dst: Path) -> str:
        """Put ``src``'s bytes at ``dst`` (which must not exist); returns the way it was done. The caller makes
        it read-only once the merge is accepted, so that a refused merge leaves a linked base's mode alone."""
        how = self._carry(src, dst)
        self.used.add(how)
        return how

    def _carry(self, src: Path, dst: Path) -> str:
        if self.mode in ("auto", "reflink"):
            try:
                with open(src, "rb") as s, open(dst, "xb") as d:
                    fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
                return "reflink"
            except OSError as e:
                dst.unlink(missing_ok=True)
                if self.mode == "reflink" or e.errno not in _UNSUPPORTED:
                    raise CarryError(e.errno, f"merge.carry: reflink of {src} failed ({e.strerror}); "
                                     "this filesystem has no reflinks (ext4): use merge.carry auto or copy") from e  # fmt: skip
        if self.mode in ("auto", "hardlink"):
            try:
                os.link(src, dst, follow_symlinks=True)
                return "hardlink"
            except OSError as e:
                if self.mode == "hardlink" or e.errno not in _UNSUPPORTED:
                    raise CarryError(e.errno, f"merge.carry: hardlink {src} -> {dst} failed ({e.strerror}); "
                                     "another filesystem or owner? use merge.carry auto or copy") from e  # fmt: skip
                log.info("hardlink %s -> %s refused (%s): copying", src, dst, e.strerror)
        shutil.copyfile(src, dst)
        return "copy"
