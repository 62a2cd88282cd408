"""OpenMP's wait policy (spinning or sleeping threads at a barrier) changes how a float stage behaves beside a busy
process, never the bytes it writes: the docs tell users on a shared machine to set OMP_WAIT_POLICY=PASSIVE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BUILD = """
import sys, hashlib
sys.path.insert(0, {tests!r})
from conftest import TINY_TARGET_PARAMS, tiny_conversations
from draftline.target.stage import TargetParams, write_target
params = {{**TINY_TARGET_PARAMS, "embedded": {{**TINY_TARGET_PARAMS["embedded"], "threads": 2, "steps": 20}}}}
write_target(TargetParams.parse(params, "target"), {out!r}, tiny_conversations())
print(hashlib.sha256(open({out!r} + "/model/model.safetensors", "rb").read()).hexdigest())
"""


def test_the_wait_policy_leaves_the_weights_alone(tmp_path: Path) -> None:
    """The same 2-thread embedded build in a fresh process (OpenMP reads the policy once, when torch loads) with
    spinning and with sleeping waits: the same weight bytes."""
    digests = {}
    for policy in ("ACTIVE", "PASSIVE"):
        code = BUILD.format(tests=str(REPO / "tests"), out=str(tmp_path / policy))
        done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_WAIT_POLICY": policy},
                              capture_output=True, text=True, check=True)
        digests[policy] = done.stdout.strip().splitlines()[-1]
    assert len(digests["ACTIVE"]) == 64 and digests["ACTIVE"] == digests["PASSIVE"]
