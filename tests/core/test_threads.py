"""What the stages set for themselves to hold their speed on a busy machine changes speed only, never bytes.

OpenMP's wait policy (spinning or sleeping threads at a barrier) decides how a float stage behaves beside a busy
process: draftline sets PASSIVE on import unless the user chose a policy (``draftline/__init__.py``). The embedded
target's build in a fresh process (OpenMP reads the policy once, when torch loads) gives the same weight bytes under
draftline's default, spinning and sleeping waits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftline.core.threads import idle_cores

REPO = Path(__file__).resolve().parents[2]

BUILD = """
import sys, hashlib
sys.path.insert(0, {tests!r})
import draftline, os
from conftest import TINY_TARGET_PARAMS, tiny_conversations
from draftline.target.params import TargetParams
from draftline.target.stage import write_target
params = {{**TINY_TARGET_PARAMS, "embedded": {{**TINY_TARGET_PARAMS["embedded"], "threads": 2, "steps": 20}}}}
write_target(TargetParams.parse(params, "target"), {out!r}, tiny_conversations())
print(os.environ.get("OMP_WAIT_POLICY"))
print(hashlib.sha256(open({out!r} + "/model/model.safetensors", "rb").read()).hexdigest())
"""


def _build(tmp_path: Path, policy: str | None) -> tuple[str, str]:
    """(the policy torch loaded under, the weights' digest) of a 2-thread build in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    code = BUILD.format(tests=str(REPO / "tests"), out=str(tmp_path / str(policy)))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded, digest = done.stdout.strip().splitlines()[-2:]
    return loaded, digest


def test_the_wait_policy_leaves_the_weights_alone(tmp_path: Path) -> None:
    runs = {policy: _build(tmp_path, policy) for policy in (None, "ACTIVE", "PASSIVE")}
    # draftline's default when the user set nothing; a user's own choice is kept.
    assert [runs[p][0] for p in (None, "ACTIVE", "PASSIVE")] == ["PASSIVE", "ACTIVE", "PASSIVE"]
    digests = {digest for _, digest in runs.values()}
    assert len(digests) == 1 and len(digests.pop()) == 64


@pytest.mark.skipif(not Path("/proc/stat").is_file() or (os.cpu_count() or 1) > 8,
                    reason="reads Linux's /proc/stat; fills every core with a busy process")
def test_idle_cores_sees_the_cores_other_processes_take() -> None:
    """evaluate.workers: auto starts one process per idle core: none idle (every core spinning) gives one."""
    cores = len(os.sched_getaffinity(0))
    assert 1 <= idle_cores(0.2) <= cores
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # the interpreters start before the window opens
        assert idle_cores(1.0) == 1
    finally:
        for s in spinners:
            s.kill()
            s.wait()


def test_a_program_with_its_own_pool_gets_the_users_settings_not_draftlines() -> None:
    """llama-server sizes its own OpenMP pool: it gets back what the user set and never draftline's one-core
    choices, in a child process too (the record of what draftline set is inherited with the variables)."""
    from draftline.core.threads import SET_HERE, one_core_environment, own_pool_environment

    env = {"OMP_NUM_THREADS": "4", "PATH": "/bin"}  # the user's thread count, no wait policy
    one_core_environment(env)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["OMP_NUM_THREADS"] == "4" and env["RAYON_NUM_THREADS"] == "1"
    child = dict(env)
    one_core_environment(child)  # a child process importing draftline again changes nothing
    assert child == env
    assert own_pool_environment(child) == {"OMP_NUM_THREADS": "4", "PATH": "/bin"}
    assert SET_HERE not in own_pool_environment(env)


def test_workers_are_checked_and_counted_in_one_place(caplog: pytest.LogCaptureFixture) -> None:
    """target.embedded.workers and evaluate.workers share one rule: at least 1 or auto, never more than one of both
    threads and forked processes; auto is the idle cores now; a fork from a multi-threaded process is refused."""
    from draftline.core.params import ParamsError
    from draftline.core.threads import check_workers, forkable, torch_threads, workers_now

    check_workers(1, "auto", "evaluate")
    check_workers(4, 1, "evaluate")
    with pytest.raises(ParamsError, match=r"evaluate\.workers must be >= 1 or auto, not 0"):
        check_workers(1, 0, "evaluate")
    with pytest.raises(ParamsError, match="target.embedded: threads 2 and workers auto: more than one of both"):
        check_workers(2, "auto", "target.embedded")
    assert workers_now(3) == 3
    assert 1 <= workers_now("auto") <= len(os.sched_getaffinity(0))
    with torch_threads(1):
        assert forkable(2, "evaluate.workers") == 2
    with torch_threads(2), caplog.at_level("WARNING"):
        assert forkable(2, "evaluate.workers") == 1
    assert "evaluate.workers is 2, but processes can only be forked from a one-thread process" in caplog.text
