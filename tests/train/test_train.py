"""Training end to end on a tiny target: learning, what the stage reports, the memory preflight, resume after a
kill, 2-process DDP, refusals without a traceback."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import drafter_support as S
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from draftline.core.errors import Refusal
from draftline.core.params import ParamsError
from draftline.core.runner import run_file
from draftline.core.schedule import lr_at
from draftline.train.data import RowStats, pack_rows, pack_shapes
from draftline.train.memory import MemoryPlanError, Shapes, estimate_bytes, preflight
from draftline.train.trainer import NonFiniteError, TrainInputError

DRIVER = Path(__file__).resolve().parents[1] / "drafter_support.py"
REPO = Path(__file__).resolve().parents[2]
HEADLINE = {"steps", "rows", "final_loss", "accuracy_pos1", "skipped"}
RUN_FIELDS = {"tokens_per_s", "train_seconds", "resumed_at_step", "states", "stage_seconds"}


@pytest.fixture
def train(monkeypatch):
    """``train(cfg, root, **paths)``: the stage run in this process on ``root``'s data (its paths as dvc.yaml lays
    them out, ``paths`` replacing some), its resumable states in ``root``'s own cache (``$DRAFTLINE_CACHE``)."""

    def run(cfg, root: Path, cache: Path | None = None, **paths):
        monkeypatch.setenv("DRAFTLINE_CACHE", str(cache or S.cache(root)))
        return S.train(cfg, S.args(root, **paths))

    return run


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    S.make_target(root)
    S.make_merged(root, S.make_rows(96))
    return root


def _copy_inputs(src: Path, dst: Path) -> Path:
    for sub in ("data/target", "data/merged"):
        os.makedirs(dst / sub, exist_ok=True)
        subprocess.run(["cp", "-r", f"{src / sub}/.", str(dst / sub)], check=True)
    return dst


def _launch(root: Path, params: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1",
           "DRAFTLINE_CACHE": str(S.cache(root))}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(root), json.dumps(params)],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_training_lowers_the_loss_and_writes_outputs(workdir, train):
    torch.set_num_threads(1)
    stage = train(S.train_params(epochs=6, log_every=5), workdir)
    report = stage.details
    # A random 6-layer target makes a hard teacher; the bar is clear learning, not a converged drafter.
    assert report["final_loss"] < 0.85 * report["first_loss"]
    ckpt = workdir / "data" / "checkpoints"
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors", "modeling_dflash.py"]
    rows = (workdir / "plots" / "train_loss.csv").read_text().splitlines()
    assert rows[0] == "step,epoch,loss,accuracy_pos1,lr,grad_norm" and len(rows) > 5
    # The one schedule (core.schedule.lr_at): the lr of a line is that of its window's last step.
    steps, warmup = report["steps"], math.ceil(0.1 * report["steps"])
    for line in rows[1:]:
        step, lr = int(line.split(",")[0]), float(line.split(",")[4])
        assert lr == float(f"{lr_at(step - 1, 3e-3, steps, warmup, 0.0):.6g}")
    # The headline: a few flat keys (DVC metrics); every detail in the report; times and speeds in the run file.
    saved = _json(workdir / "metrics" / "train.json")
    assert set(saved) == HEADLINE and saved == {**stage.headline, "skipped": 0}
    assert saved["steps"] == report["steps"] and saved["rows"] == 96
    assert all(not isinstance(v, (dict, list)) for v in saved.values())
    on_disk = _json(workdir / "reports" / "train.json")
    assert on_disk == {**report, "skips": {}} and on_disk["preflight"]["measured"] is False
    assert {"loss_tokens_kept", "loss_tokens_cut", "train_tokens", "drafter_params", "target_layer_ids",
            "target_features"} <= set(on_disk)
    assert not {"tokens_per_s", "train_seconds", "stage_seconds"} & set(on_disk)
    run = _json(run_file(workdir / "reports" / "train.json"))
    assert set(run) == RUN_FIELDS and run["resumed_at_step"] == 0 and run["train_seconds"] > 0
    # Lineage: what the training set was made with travels in the checkpoint's config.
    config = json.loads((ckpt / "config.json").read_text())
    # Saved in the target's dtype, which the tiny target's config.json names (fp32 here: a bf16 target gives bf16).
    target_dtype = json.loads((workdir / "target-model" / "config.json").read_text())["dtype"]
    assert config["dtype"] == config["torch_dtype"] == target_dtype
    assert config["auto_map"] == {"AutoModel": "modeling_dflash.DFlashDraftModel"}
    assert config["draftline"] == {"tokenizer_fingerprint": "test", "chat_template_sha256": "test",
                                   "enable_thinking": False, "mask_token_id": S.MASK_ID}


def test_a_training_set_of_another_tokenizer_is_refused(tmp_path, workdir, train):
    root = _copy_inputs(workdir, tmp_path)
    target = root / "data" / "target" / "target.json"
    target.write_text(json.dumps({**json.loads(target.read_text()), "tokenizer_fingerprint": "other"}))
    with pytest.raises(TrainInputError, match="another tokenizer") as e:
        train(S.train_params(), root)
    assert isinstance(e.value, Refusal)


def test_the_stage_script_refuses_in_one_line_without_a_traceback(tmp_path, workdir):
    """``python stages/train.py`` with dvc.yaml's flags: a refusal is one message and exit code 1."""
    import yaml

    root = _copy_inputs(workdir, tmp_path)
    target = root / "data" / "target" / "target.json"
    target.write_text(json.dumps({**json.loads(target.read_text()), "tokenizer_fingerprint": "other"}))
    (root / "params.yaml").write_text(yaml.safe_dump({"train": S.small_params()}))
    a = S.args(root)
    flags = [x for f in ("merged", "target", "out", "metrics", "report", "plot", "drafters")
             for x in (f"--{f}", str(getattr(a, f)))]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "DRAFTLINE_CACHE": str(S.cache(root))}
    env.pop("DRAFTLINE_PARAMS", None)
    done = subprocess.run([sys.executable, str(REPO / "stages" / "train.py"), *flags], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [x for x in done.stderr.splitlines() if "another tokenizer" in x]
    assert len(lines) == 1 and lines[0].startswith("train: ") and "re-run tokenize and merge" in lines[0]
    assert not a.metrics.exists() and not a.report.exists()


def test_adam_betas_are_a_param():
    assert S.train_params().adam_betas == [0.9, 0.95]
    with pytest.raises(ParamsError, match="adam_betas"):
        S.train_params(adam_betas=[0.9])
    with pytest.raises(ParamsError, match="adam_betas"):
        S.train_params(adam_betas=[0.9, 1.0])


def _shapes() -> Shapes:
    return Shapes(target_param_bytes=10**6, drafter_params=10**5, target_layers=6, hidden=64, intermediate=128,
                  heads=4, kv_heads=2, head_dim=16, vocab=256, drafter_layers=1, features=3, block_size=8,
                  act_bytes=4)


def test_preflight_refuses_and_names_a_budget_that_fits():
    lengths = np.array([40, 400, 380, 120, 60, 300, 390, 200])
    stats = RowStats(lengths=lengths, anchors=np.full(8, 64), kept_loss_tokens=0, cut_loss_tokens=0)
    order = np.random.default_rng(0).permutation(8)

    def packs_at(budget: int):
        return pack_shapes(pack_rows(order, lengths, budget), stats, 64)

    def run(budget: int, limit_gb: float):
        return preflight(_shapes(), packs_at(budget), limit_gb=limit_gb, budget=budget, packs_at=packs_at)

    ok = run(400, 1.0)
    assert ok.estimated_bytes == max(estimate_bytes(_shapes(), *p) for p in packs_at(400))  # the worst pack
    limit = ok.peak_bytes * 2.5 / 1024**3
    assert run(400, limit).peak_bytes <= limit * 1024**3
    with pytest.raises(MemoryPlanError, match=r"max_tokens_per_batch <= (\d+)") as err:
        run(2400, limit)
    fit = int(re.search(r"max_tokens_per_batch <= (\d+)", str(err.value)).group(1))
    assert 400 <= fit < 2400
    run(fit, limit)  # the named budget passes
    with pytest.raises(MemoryPlanError, match="max_length"):
        run(400, ok.peak_bytes * 0.5 / 1024**3)  # not even one longest row fits


def test_train_refuses_before_step_one(tmp_path, workdir, train):
    root = _copy_inputs(workdir, tmp_path)
    with pytest.raises(MemoryPlanError, match="memory_limit_gb") as e:
        train(S.train_params(memory_limit_gb=0.001), root)
    assert isinstance(e.value, Refusal)
    assert not (root / "data" / "checkpoints").exists() and not (root / ".draftline").exists()
    assert not (root / "metrics").exists() and not (root / "reports").exists()


def test_resume_after_kill_matches_an_uninterrupted_run(tmp_path, workdir):
    params = S.small_params(max_steps=120, save_every=10, log_every=10)
    full = _copy_inputs(workdir, tmp_path / "full")
    killed = _copy_inputs(workdir, tmp_path / "killed")
    p = _launch(killed, params)
    states = S.cache(killed) / "train"
    deadline = time.time() + 120
    while not list(states.glob("*/state-*.pt")) and time.time() < deadline:
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    saved = [int(s.stem.split("-")[1]) for s in states.glob("*/state-*.pt")]
    assert saved and max(saved) < 120, "the run finished before it could be killed"
    assert not (killed / "data" / "checkpoints").exists()

    resumed = _launch(killed, params)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert f"resuming from step {max(saved)}" in out
    assert _json(run_file(killed / "reports" / "train.json"))["resumed_at_step"] == max(saved)
    straight = _launch(full, params)
    out_full, _ = straight.communicate(timeout=300)
    assert straight.returncode == 0, out_full

    a = load_file(str(killed / "data" / "checkpoints" / "model.safetensors"))
    b = load_file(str(full / "data" / "checkpoints" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (killed / "plots" / "train_loss.csv").read_text() == (full / "plots" / "train_loss.csv").read_text()
    # The metrics and the report are the same bytes; the run file (resume step, speed) is where they differ.
    for f in ("metrics/train.json", "reports/train.json"):
        assert (killed / f).read_bytes() == (full / f).read_bytes(), f


def test_two_process_gloo_ddp(tmp_path, workdir, train):
    root = _copy_inputs(workdir, tmp_path)
    p = _launch(root, S.small_params(gpus=2, epochs=1, log_every=2))
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    assert "relaunching under torchrun" in out
    metrics, report = _json(root / "metrics" / "train.json"), _json(root / "reports" / "train.json")
    single = train(S.train_params(epochs=1), _copy_inputs(workdir, tmp_path / "one"))
    # Two ranks share each epoch's batches (cut to an even count): half the optimizer steps, the same tokens.
    assert set(metrics) == HEADLINE and metrics["steps"] == single.headline["steps"] // 2
    assert report["train_tokens"] >= 0.9 * single.details["train_tokens"]
    # The launching process wrote rank 0's figures back, with its own stage_seconds.
    assert set(_json(run_file(root / "reports" / "train.json"))) == RUN_FIELDS
    assert (root / "data" / "checkpoints" / "model.safetensors").exists()


def _nan_world(tmp_path: Path) -> Path:
    """A target whose embedding row of token 250 is NaN, and a training set in which row r5 alone holds that token
    (in its prompt): every batch with r5 has a NaN loss, the others train normally."""
    from safetensors.torch import load_file, save_file

    S.make_target(tmp_path)
    weights = tmp_path / "target-model" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.embed_tokens.weight"][250] = float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    rows = S.make_rows(96)
    rows["input_ids"][5][0] = 250
    S.make_merged(tmp_path, rows)
    return tmp_path


def test_a_nonfinite_loss_stops_training_naming_the_step_and_rows_after_saving_the_last_good_state(tmp_path, train):
    root = _nan_world(tmp_path)
    with pytest.raises(NonFiniteError, match=r"step (\d+): loss nan .*'r5'.*train.skip_nonfinite") as e:
        train(S.train_params(epochs=1, save_every=1000), root)
    assert isinstance(e.value, Refusal)
    step = int(re.search(r"step (\d+):", str(e.value)).group(1))
    states = list((S.cache(root) / "train").glob("*/state-*.pt"))
    assert [int(p.stem.split("-")[1]) for p in states] == [step - 1]  # the weights before the bad step
    state = torch.load(states[0], weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert not (root / "data" / "checkpoints").exists()


def test_skip_nonfinite_skips_and_counts_such_batches(tmp_path, train):
    root = _nan_world(tmp_path)
    stage = train(S.train_params(epochs=1, skip_nonfinite=2), root)
    assert stage.details["nonfinite_batches_skipped"] == 1  # r5 is in one batch an epoch
    assert math.isfinite(stage.headline["final_loss"])
    from safetensors.torch import load_file

    weights = load_file(str(root / "data" / "checkpoints" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_a_corrupted_state_is_skipped_and_the_one_before_it_resumes(tmp_path, workdir, caplog):
    from draftline.train.state import load_latest, save_state

    folder = tmp_path / "states"
    for step in (10, 20, 30):
        save_state(folder, step, {"model": {"w": torch.full((2,), float(step))}, "history": [{"step": step}]})
    assert sorted(p.name for p in folder.iterdir()) == ["state-00000020.pt", "state-00000030.pt"]  # two kept
    newest = folder / "state-00000030.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated, as by a full disk
    state = load_latest(folder)
    assert state["step"] == 20 and torch.equal(state["model"]["w"], torch.full((2,), 20.0))
    assert "does not load" in caplog.text


def test_a_state_that_would_run_code_is_never_unpickled(tmp_path):
    """weights_only: a pickle carrying an arbitrary object (here one whose unpickling writes a file) is refused."""
    import pickle

    from draftline.train.state import load_latest, state_path

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    folder = tmp_path / "states"
    folder.mkdir()
    with open(state_path(folder, 5), "wb") as f:
        pickle.dump({"step": 5, "model": Evil()}, f)
    assert load_latest(folder) is None and not marker.exists()


def test_a_full_disk_fails_naming_the_state_leaves_nothing_then_the_rerun_gives_the_same_bytes(tmp_path, workdir,
                                                                                              small_disk, train):
    """Training states and the checkpoint on a disk too small for a state: the error names the state file, no
    temporary is left, and once space is freed the rerun trains to the uninterrupted run's checkpoint bytes."""
    from draftline.core.files import DiskFullError

    cfg = S.train_params(max_steps=12, save_every=5)
    ref = _copy_inputs(workdir, tmp_path / "ref")
    train(cfg, ref)
    root = _copy_inputs(workdir, tmp_path / "run")
    disk = small_disk(8192)
    out = disk.path / "checkpoints"
    with pytest.raises(DiskFullError, match=r"a training state \(.*state-00000005\.pt\)"):
        train(cfg, root, cache=disk.path / "cache", out=out)
    assert disk.leftovers() == [] and not out.exists()
    disk.grow(64 << 20)
    train(cfg, root, cache=disk.path / "cache", out=out)
    for name in ("model.safetensors", "config.json"):
        assert (out / name).read_bytes() == (ref / "data/checkpoints" / name).read_bytes()


def test_same_bytes_under_thread_pressure(tmp_path, workdir, train):
    """Two runs, the second beside processes that keep both cores busy: the checkpoint is byte-identical (issue 12:
    float stages must be reproducible on one machine however loaded it is). Two threads, the case that can differ."""
    cfg = S.train_params(max_steps=12, save_every=100, threads=2)
    quiet = _copy_inputs(workdir, tmp_path / "quiet")
    train(cfg, quiet)
    busy = _copy_inputs(workdir, tmp_path / "busy")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        train(cfg, busy)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for name in ("model.safetensors", "config.json"):
        assert (busy / "data/checkpoints" / name).read_bytes() == (quiet / "data/checkpoints" / name).read_bytes()
    for name in ("plots/train_loss.csv", "metrics/train.json", "reports/train.json"):
        assert (busy / name).read_bytes() == (quiet / name).read_bytes(), name


def test_rows_unable_to_train_over_the_share_stop_the_stage_naming_the_param(tmp_path, train):
    from draftline.core.skips import SkipError

    S.make_target(tmp_path)
    rows = S.make_rows(40)
    for m in rows["loss_mask"][:4]:  # 10% of the rows with nothing supervised
        m[:] = [False] * len(m)
    S.make_merged(tmp_path, rows)
    with pytest.raises(SkipError, match=r"4 of 40 rows .* 'no two consecutive supervised tokens', more than "
                                        r"train.max_skip_share \(0.01\)"):
        train(S.train_params(), tmp_path)
    stage = train(S.train_params(max_steps=2, max_skip_share=0.2), tmp_path)
    assert stage.skips.as_dict() == {"no two consecutive supervised tokens": 4} and stage.headline["rows"] == 36
    assert _json(tmp_path / "metrics" / "train.json")["skipped"] == 4
    assert _json(tmp_path / "reports" / "train.json")["skips"] == {"no two consecutive supervised tokens": 4}
