"""How a merge puts a shard file that already exists (the base's, or the new rows' when none was dropped) into
``data/merged`` byte-identical: a reflink, a hardlink or a copy (``merge.carry``).

Shards are immutable: nothing in draftline writes into an existing shard (writers write a temporary name, then
rename), and neither does DVC: ``dvc checkout`` removes a workspace file before it links or copies the cached one
(``dvc_data.hashfile.checkout._relink``), and a copy goes to a temporary name that then replaces the path
(``dvc_objects.fs.local.LocalFileSystem.put_file``). So two names for one file are safe as long as neither is also
a DVC cache object, where a write through it would corrupt the cache silently (root ignores DVC's read-only mode).

``auto`` therefore takes, per file:

1. a reflink (``FICLONE``: btrfs, XFS, ...): copy-on-write, instant, always safe;
2. else a hardlink, when the DVC repository holding ``data/merged`` keeps its cache by ``reflink``/``copy`` (DVC's
   default): the cache then holds its own copy of every file, so the base's files are not cache objects. On
   ``dvc commit`` (the end of ``dvc repro``) DVC replaces a hardlinked output with a copy from its cache
   (``dvc_data.hashfile.checkout._needs_relink``: a ``copy`` cache wants files with one link), so the link lives
   only from the stage's run to DVC's commit, or while the stage runs outside DVC;
3. else (``cache.type`` names ``hardlink`` or ``symlink``: the base's files are cache objects; or the link failed:
   another filesystem, another owner) a copy.

Every shard of ``data/merged`` is made read-only (0444, :func:`make_read_only`) once the merge is accepted: a
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
# DVC's cache.type when its config sets none (dvc_data.hashfile.db.HashFileDB.DEFAULT_CACHE_TYPES).
DVC_DEFAULT_CACHE_TYPES = ["reflink", "copy"]
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def dvc_cache_types(folder: str | os.PathLike) -> list[str] | None:
    """``cache.type`` of the DVC repository holding ``folder`` (system, global, repo and local config merged, read
    by DVC's own config loader); None outside a DVC repository."""
    folder = Path(folder).absolute()
    root = next((p for p in (folder, *folder.parents) if (p / ".dvc").is_dir()), None)
    if root is None:
        return None
    from dvc.config import Config

    return list(Config(dvc_dir=str(root / ".dvc"))["cache"].get("type") or DVC_DEFAULT_CACHE_TYPES)


def hardlink_is_safe(out_dir: str | os.PathLike) -> bool:
    """True when no file the merge could link to is a DVC cache object (see the module docstring)."""
    types = dvc_cache_types(out_dir)
    return types is None or not {"hardlink", "symlink"} & set(types)


def make_read_only(path: Path) -> None:
    """Mode 0444; a hardlinked file owned by someone else keeps its mode (not ours to change)."""
    try:
        os.chmod(path, READ_ONLY)
    except PermissionError:
        log.debug("could not make %s read-only (not its owner)", path)


class Carrier:
    """Carries shard files into one merged folder in ``mode`` (``merge.carry``), and records how."""

    def __init__(self, mode: str, out_dir: str | os.PathLike):
        if mode not in CARRY_MODES:
            raise ValueError(f"merge.carry must be one of {CARRY_MODES}, not {mode!r}")
        self.mode = mode
        self.out_dir = Path(out_dir)
        self._hardlink_ok: bool | None = None  # decided on first need: reading DVC's config costs ~0.1 s
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
                    raise OSError(e.errno, f"merge.carry: reflink of {src} failed ({e.strerror}); "
                                  "this filesystem has no reflinks (ext4): use merge.carry auto or copy") from e  # fmt: skip
        if self.mode == "hardlink" or (self.mode == "auto" and self._hardlink_allowed()):
            try:
                os.link(src, dst, follow_symlinks=True)
                return "hardlink"
            except OSError as e:
                if self.mode == "hardlink" or e.errno not in _UNSUPPORTED:
                    raise OSError(e.errno, f"merge.carry: hardlink {src} -> {dst} failed ({e.strerror}); "
                                  "another filesystem or owner? use merge.carry auto or copy") from e  # fmt: skip
                log.info("hardlink %s -> %s refused (%s): copying", src, dst, e.strerror)
        shutil.copyfile(src, dst)
        return "copy"

    def _hardlink_allowed(self) -> bool:
        if self._hardlink_ok is None:
            self._hardlink_ok = hardlink_is_safe(self.out_dir)
            if not self._hardlink_ok:
                log.info("DVC's cache.type links workspace files to the cache: carrying shards by copy "
                         "(merge.carry: hardlink would link to cache objects; see docs/merge.md)")  # fmt: skip
        return self._hardlink_ok
