"""Decode token rows and encode the text again: the ids come back only under the tokenizer that made them.

The check itself takes milliseconds; loading a 150K-token vocabulary takes ~0.3 s and holds the GIL throughout
(``tokenizers`` parses ``tokenizer.json`` without releasing it), so a thread cannot hide it. The merge therefore
runs the check in a child process that imports nothing but ``tokenizers`` (:func:`start_check`), and collects the
count before it publishes anything. ``python -m draftline.merge.reencode TOKENIZER_JSON`` is that child: rows as a JSON
list on stdin, ``{"matched": n}`` on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


def count_round_trips(tokenizer: Any, rows: list[list[int]]) -> int:
    """How many ``rows`` decode and re-encode to the same ids under ``tokenizer`` (a ``tokenizers.Tokenizer``).

    Ids outside the vocabulary cannot be decoded: such a row counts as a mismatch.
    """
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    decodable = [max(r, default=0) < vocab for r in rows]
    texts = tokenizer.decode_batch([r if ok else [] for r, ok in zip(rows, decodable)], skip_special_tokens=False)
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
    return sum(ok and e.ids == r for ok, e, r in zip(decodable, encoded, rows))


def _child(tokenizer_json: Path, rows: list[list[int]]) -> int:
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, "-m", "draftline.merge.reencode", str(tokenizer_json)],
        input=json.dumps(rows).encode(),
        capture_output=True,
        env=env,
    )
    if run.returncode:
        raise RuntimeError(f"the re-encode check on {tokenizer_json} failed:\n{run.stderr.decode(errors='replace')}")
    return int(json.loads(run.stdout)["matched"])


def start_check(tokenizer_json: str | os.PathLike, rows: list[list[int]]) -> Future[int]:
    """Start counting the round trips of ``rows`` in a child process; ``.result()`` waits for the count.

    The thread only waits on the child's pipes (the GIL is free meanwhile), so the caller keeps working.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reencode")
    future = pool.submit(_child, Path(tokenizer_json), rows)
    pool.shutdown(wait=False)
    return future


def _main() -> None:
    from tokenizers import Tokenizer

    rows = json.load(sys.stdin)
    matched = count_round_trips(Tokenizer.from_file(sys.argv[1]), rows)
    json.dump({"matched": matched}, sys.stdout)


if __name__ == "__main__":
    _main()
