"""The merge stage on small real datasets: carried shards, overlap, guards, order, stats.

Rows are made by really tokenizing chat-like texts (with a small BPE tokenizer trained here, or the real Qwen3
tokenizer from ../shared), so the re-encode guard sees genuine token ids.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from conftest import default_params
from merge_support import (
    chat_rows,
    file_hashes,
    make_rows,
    save_int64,
    train_tokenizer,
    write_legacy,
    write_target,
    write_tokenized,
)

from draftline.core import dataset as fmt
from draftline.core.classify import DOMAINS
from draftline.core.dataset import ORDER_FILE, load_training_set
from draftline.core.errors import MissingInput, Refusal
from draftline.core.files import DiskFullError
from draftline.core.mix import read_record
from draftline.core.runner import StageRun, execute, main, run_file
from draftline.core.tracked import Untracked
from draftline.merge.carry import CarryError
from draftline.merge.guards import PROMPT_KEY_PREFIX, MergeGuardError
from draftline.merge.params import MergeParams
from draftline.merge.stage import MergeArgs, run_merge


def merge_params(**overrides) -> MergeParams:
    return MergeParams.parse(default_params("merge", **overrides), "merge")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def world(tmp_path: Path, tok_dir: Path):
    """A project layout: target.json, a draftline base of 40 rows and 30 new rows of which 5 repeat base ids."""
    info = write_target(tmp_path / "data/target/target.json", tok_dir)
    base_rows = make_rows(tok_dir, [f"b{i}" for i in range(40)], seed=1, source="old")
    new_ids = [f"b{i}" for i in range(5)] + [f"n{i}" for i in range(25)]
    new_rows = make_rows(tok_dir, new_ids, seed=2, source="fresh")
    write_tokenized(tmp_path / "data/bases/r1", base_rows, info)
    write_tokenized(tmp_path / "data/tokenized", new_rows, info)
    return tmp_path, info, base_rows, new_rows


def stage_args(root: Path, out: Path | None = None, bases: Path | None = None) -> MergeArgs:
    """The paths dvc.yaml passes, under ``root`` (``bases``: where merge.base must lie, ``root/data/bases``)."""
    return MergeArgs(tokenized=root / "data/tokenized", target=root / "data/target/target.json",
                     out=out or root / "data/merged", metrics=root / "metrics/merge.json",
                     report=root / "reports/merge.json", plot=root / "plots/merge_mix.csv",
                     bases=bases or root / "data/bases")


def merge_run(root: Path, out: Path | None = None, bases: Path | None = None, **params) -> StageRun:
    return execute("merge", run_merge, merge_params(**params), stage_args(root, out, bases))


def merge(root: Path, bases: Path | None = None, **params) -> dict:
    """The merge's details (its report, less the runner's skips)."""
    return merge_run(root, bases=bases, **params).details


def tracked_tokenizer(root: Path, tokenizer: Path) -> Path:
    """A copy of a tokenizer folder under ``root/data/bases``, where merge.base_tokenizer must name one."""
    return Path(shutil.copytree(tokenizer, root / "data/bases" / f"tokenizer-{tokenizer.name}"))


def test_a_damaged_base_shard_is_refused_before_anything_is_written(world):
    root = world[0]
    base_dir = root / "data/bases/r1"
    victim = base_dir / fmt.shard_files(base_dir)[1]
    victim.write_bytes(victim.read_bytes()[:-100])  # a copy cut short
    with pytest.raises(fmt.CorruptShardError, match=victim.name):
        merge(root, base=str(base_dir))
    assert not (root / "data/merged").exists()


def test_a_full_disk_fails_naming_the_output_leaves_nothing_then_the_rerun_gives_the_same_bytes(world, small_disk):
    root = world[0]
    base = str(root / "data/bases/r1")
    merge(root, base=base)
    reference = file_hashes(root / "data/merged")
    disk = small_disk(3 * 4096)  # a few pages: the base's shards do not all fit
    out = disk.path / "merged"

    def run():
        return merge_run(root, out, base=base)

    with pytest.raises(DiskFullError, match=r"merged"):
        run()
    assert not out.exists() and disk.leftovers() == []
    disk.grow(1 << 20)
    run()
    assert file_hashes(out) == reference


def test_a_draftline_base_is_checked_against_the_vocabulary_from_its_recorded_ranges(world):
    root, info = world[0], world[1]
    base = root / "data/bases/r1"
    meta = fmt.read_meta(base)
    assert all(0 <= s.token_id_min <= s.token_id_max < info.vocab_size for s in meta.shards)
    # What a base made with a larger vocabulary records (its checksums still match: nothing else changed).
    meta.shards[1].token_id_max = info.vocab_size + 7
    fmt.write_meta(base, meta)
    with pytest.raises(MergeGuardError, match=rf"{meta.shards[1].filename} holds token ids in \[\d+, {info.vocab_size + 7}\]"):
        merge(root, base=str(base))


def test_carried_shards_keep_their_verified_checksums(world):
    root = world[0]
    merge(root, base=str(root / "data/bases/r1"))
    out = root / "data/merged"
    meta = fmt.read_meta(out)
    base = fmt.read_meta(root / "data/bases/r1")
    assert [s.xxh3_128 for s in meta.shards[: len(base.shards)]] == [s.xxh3_128 for s in base.shards]
    fmt.verify_shards(out, meta)


def test_no_base_carries_the_new_data_as_is(world):
    root, _, _, new_rows = world
    m = merge(root)
    src, out = root / "data/tokenized", root / "data/merged"
    assert [file_hashes(src)[f] for f in fmt.shard_files(src)] == [file_hashes(out)[f] for f in fmt.shard_files(out)]
    ds, order, _ = load_training_set(out)
    assert ds["id"] == new_rows.column("id").to_pylist()
    assert sorted(order.tolist()) == list(range(30)) and order.dtype == np.int64
    assert m["base"] is None and m["overlap"]["dropped"] == 0 and m["merged"]["samples"] == 30


def test_base_shards_carried_byte_identical_then_new_rows_minus_overlap(world):
    root, _, base_rows, new_rows = world
    base_dir = root / "data/bases/r1"
    assert len(fmt.shard_files(base_dir)) > 1  # several shards, so order across shards is exercised
    m = merge(root, base=str(base_dir))
    out = root / "data/merged"
    base_h, out_h = file_hashes(base_dir), file_hashes(out)
    base_files, out_files = fmt.shard_files(base_dir), fmt.shard_files(out)
    assert [out_h[f] for f in out_files[: len(base_files)]] == [base_h[f] for f in base_files]
    ds, order, _ = load_training_set(out)
    want_ids = base_rows.column("id").to_pylist() + [f"n{i}" for i in range(25)]
    assert ds["id"] == want_ids
    assert ds[40]["input_ids"] == new_rows.column("input_ids")[5].as_py()  # new rows kept intact
    assert m["overlap"] == {"new_rows": 30, "dropped": 5, "dropped_by_id": 5, "dropped_by_prompt_tokens": 0, "kept": 25}
    assert m["base_shards_carried"] == len(base_files)
    assert m["guards"]["tokenizer_claim"] == "draftline.json"
    assert m["guards"]["reencode"] == {"checked": 40, "matched": 40}
    meta = fmt.read_meta(out)
    assert meta.num_rows == 65 and meta.num_tokens == sum(len(x) for x in ds["input_ids"])
    assert sorted(order.tolist()) == list(range(65))


def test_stats_match_the_rows(world):
    root, _, base_rows, new_rows = world
    m = merge(root, base=str(root / "data/bases/r1"))
    base_n = base_rows.column("num_tokens").to_numpy()
    kept_n = new_rows.column("num_tokens").to_numpy()[5:]
    all_n = np.concatenate([base_n, kept_n])
    assert m["base"]["samples"] == 40 and m["base"]["total_tokens"] == int(base_n.sum())
    assert m["merged"]["total_tokens"] == int(all_n.sum())
    assert m["merged"]["len_p90"] == pytest.approx(float(np.percentile(all_n, 90)))
    loss = int(base_rows.column("num_loss_tokens").to_numpy().sum() + new_rows.column("num_loss_tokens").to_numpy()[5:].sum())
    assert m["merged"]["loss_coverage"] == pytest.approx(loss / all_n.sum(), abs=1e-6)
    mix = m["merged"]["by_source"]
    assert set(mix) == {"old", "fresh"} and mix["old"]["samples"] == 40 and mix["fresh"]["samples"] == 25
    assert mix["old"]["share_rows"] == pytest.approx(40 / 65, abs=1e-6)
    assert mix["fresh"]["share_tokens"] == pytest.approx(kept_n.sum() / all_n.sum(), abs=1e-6)
    assert json.loads((root / "reports/merge.json").read_text()) == json.loads(json.dumps({**m, "skips": {}}))
    content = m["mix"]  # by content: every row of base, new and merged has a domain and a language
    assert [sum(content[k]["rows"].values()) for k in ("base", "new", "merged")] == [40, 25, 65]
    assert sum(content["merged"]["tokens"].values()) == int(all_n.sum()) and content["merged"]["languages"] == {"en": 65}
    assert json.loads((root / "metrics/merge.json").read_text()) == {
        "rows": 65, "tokens": int(all_n.sum()), "loss_tokens": loss, "dropped": 5, "base_rows": 40, "skipped": 0,
        "mix": {d: content["merged"]["row_shares"][d] for d in DOMAINS},
    }
    # mix.json records every shard of the merged set by its checksum.
    assert set(read_record(root / "data/merged")) == {s.xxh3_128 for s in fmt.read_meta(root / "data/merged").shards}
    assert set(json.loads(run_file(root / "reports/merge.json").read_text())) == {"stage_seconds", "mix"}


def test_deterministic_and_seeded(world):
    root, *_ = world
    merge(root, base=str(root / "data/bases/r1"), seed=3)
    first = file_hashes(root / "data/merged")
    reported = [(root / f).read_bytes() for f in ("metrics/merge.json", "reports/merge.json")]
    merge(root, base=str(root / "data/bases/r1"), seed=3)
    assert file_hashes(root / "data/merged") == first
    assert [(root / f).read_bytes() for f in ("metrics/merge.json", "reports/merge.json")] == reported
    merge(root, base=str(root / "data/bases/r1"), seed=4)
    again = file_hashes(root / "data/merged")
    assert again[ORDER_FILE] != first[ORDER_FILE]
    assert {k: v for k, v in again.items() if k != ORDER_FILE} == {k: v for k, v in first.items() if k != ORDER_FILE}


def test_base_with_another_fingerprint_is_refused_before_writing(world, tmp_path_factory):
    """A draftline base records its tokenizer's fingerprint: another than the target's is refused in one line naming
    merge.base, both fingerprints and the fix, and the previous output and its metrics are left as they were."""
    root, info, base_rows, _ = world
    other_dir = train_tokenizer(tmp_path_factory.mktemp("other"), vocab_size=380)
    other = write_target(tmp_path_factory.mktemp("t") / "target.json", other_dir)
    alien = root / "data/bases/alien"
    write_tokenized(alien, make_rows(other_dir, ["a0", "a1"], seed=5), other)
    merge(root)  # a previous good output must survive a refused merge
    before = file_hashes(root / "data/merged")
    reported = [(root / f).read_bytes() for f in ("metrics/merge.json", "reports/merge.json")]
    with pytest.raises(MergeGuardError) as refused:
        merge(root, base=str(alien))
    assert other.tokenizer_fingerprint[:12] != info.tokenizer_fingerprint[:12]
    assert str(refused.value) == (
        f"params.yaml: merge.base ({alien}) was made, says its draftline.json, with tokenizer fingerprint "
        f"{other.tokenizer_fingerprint[:12]}, the target's is {info.tokenizer_fingerprint[:12]}: the base's token ids "
        "mean other tokens under the target; set merge.base to a set tokenized with the target, or tokenize the "
        "base's conversations with it")
    assert file_hashes(root / "data/merged") == before
    assert [(root / f).read_bytes() for f in ("metrics/merge.json", "reports/merge.json")] == reported


def untracked_message(field: str, value: Path, bases: Path) -> str:
    """The refusal of ``value`` (param ``field``) outside ``bases``, written out in full: what the user reads."""
    inside = bases / value.name
    return (f"params.yaml: {field} ({value}) is outside {bases}, which DVC tracks for this stage: a change to it would "
            f"not rerun the stage. Copy it in and track it: cp -r {value} {inside} && dvc add {inside}; then set "
            f"{field}: {inside}")


def test_a_base_outside_the_bases_folder_is_refused_with_the_fix_before_it_is_read(world, tmp_path_factory):
    """DVC cannot see a base outside the stage's bases folder change (a rerun would reuse a merge of its old rows):
    refused in one line naming merge.base, its value, the folder and the commands that fix it, before the base is
    read (a shard of this copy is cut short, which reading would refuse otherwise), and nothing is written."""
    root = world[0]
    outside = tmp_path_factory.mktemp("elsewhere") / "round0"
    shutil.copytree(root / "data/bases/r1", outside)
    victim = outside / fmt.shard_files(outside)[0]
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(Untracked) as refused:
        merge(root, base=str(outside))
    assert str(refused.value) == untracked_message("merge.base", outside, root / "data/bases")
    assert not (root / "data/merged").exists() and not (root / "metrics/merge.json").exists()
    with pytest.raises(fmt.CorruptShardError, match=victim.name):  # the same base, where the stage may read it
        merge(root, base=str(outside), bases=outside.parent)


def test_a_base_tokenizer_outside_the_bases_folder_is_refused_with_the_fix(world, tok_dir):
    """merge.base_tokenizer is a dependency too (its fingerprint decides whether a legacy base is merged): outside
    the bases folder it is refused as merge.base is, before the tokenizer or the base is read; inside, it is taken."""
    root, _, base_rows, _ = world
    legacy = root / "data/bases/legacy"
    write_legacy(legacy, base_rows, with_ids=True)
    with pytest.raises(Untracked) as refused:
        merge(root, base=str(legacy), base_tokenizer=str(tok_dir))
    assert str(refused.value) == untracked_message("merge.base_tokenizer", tok_dir, root / "data/bases")
    assert not (root / "data/merged").exists() and not (root / "metrics/merge.json").exists()
    m = merge(root, base=str(legacy), base_tokenizer=str(tracked_tokenizer(root, tok_dir)))
    assert m["guards"]["tokenizer_claim"] == "base_tokenizer"


def test_legacy_base_needs_a_claim_then_is_cast_and_matched_on_prompt_tokens(world, tok_dir):
    root, info, base_rows, new_rows = world
    legacy = root / "data/bases/legacy"
    write_legacy(legacy, base_rows)
    with pytest.raises(MergeGuardError, match="no draftline.json"):
        merge(root, base=str(legacy))
    assert not (root / "data/merged").exists()
    m = merge(root, base=str(legacy), assume_same_tokenizer=True)
    assert m["guards"]["base_kind"] == "legacy" and m["guards"]["tokenizer_claim"] == "assumed"
    assert set(m["guards"]["casts"]) == {"input_ids", "loss_mask"}
    assert m["guards"]["derived_columns"] == ["id", "source", "num_tokens", "num_loss_tokens"]
    # The 5 new rows that repeat base prompts are found by their prompt tokens (legacy rows have no ids).
    assert m["overlap"]["dropped_by_prompt_tokens"] == 5 and m["overlap"]["dropped_by_id"] == 0
    ds, _, _ = load_training_set(root / "data/merged")
    assert ds.features == fmt.FEATURES
    assert ds["input_ids"][:40] == base_rows.column("input_ids").to_pylist()
    assert ds["loss_mask"][:40] == base_rows.column("loss_mask").to_pylist()
    assert all(i.startswith(PROMPT_KEY_PREFIX) for i in ds["id"][:40]) and set(ds["source"][:40]) == {"legacy"}

    # Next round: the merged set is the base; rows that came from the legacy base are still matched by prompt.
    round2 = root / "data/bases/r2"
    (root / "data/merged").rename(round2)
    fresh = make_rows(tok_dir, ["z0"], seed=9, source="fresh")
    # These two repeat legacy prompts under new ids: only their prompt tokens can tell.
    repeat = new_rows.slice(0, 2).set_column(0, "id", pa.array(["x0", "x1"]))
    write_tokenized(root / "data/tokenized", pa.concat_tables([fresh, repeat]), info)
    m2 = merge(root, base=str(round2))
    assert m2["overlap"]["dropped_by_prompt_tokens"] == 2 and m2["overlap"]["kept"] == 1
    assert m2["base_shards_carried"] > 0


def test_a_legacy_base_is_hashed_once_then_its_keys_are_recorded(world):
    """Round 1 hashes the legacy base's prompts once; the converted shards carry those keys (as ids and in their
    sidecars), and every shard of the merged set records its keys, so the next round reads them."""
    root, info, base_rows, _ = world
    write_legacy(root / "data/bases/legacy", base_rows)
    merge(root, base=str(root / "data/bases/legacy"), assume_same_tokenizer=True)
    meta = fmt.read_meta(root / "data/merged")
    assert all(s.keys_xxh3_128 for s in meta.shards)
    keys = fmt.read_keys(root / "data/merged", meta)
    ds = fmt.load(root / "data/merged")
    assert ds["id"][:40] == [PROMPT_KEY_PREFIX + k.tobytes().hex() for k in keys[:40]]
    assert np.array_equal(keys[:40], fmt.prompt_key_digests(base_rows))
    assert all(stat.S_IMODE(fmt.keys_path(root / "data/merged" / s.filename).stat().st_mode) == 0o444
               for s in meta.shards)


def test_overlap_is_found_through_the_recorded_keys(world, tok_dir):
    """New rows are matched against legacy rows by the keys their shards record, not by hashing their tokens:
    a key record that names a legacy prompt drops the row although its tokens differ."""
    root, info, base_rows, _ = world
    write_legacy(root / "data/bases/legacy", base_rows)
    fresh = make_rows(tok_dir, [f"z{i}" for i in range(6)], seed=9, source="fresh")
    meta = write_tokenized(root / "data/tokenized", fresh, info, max_shard_bytes=1 << 20)
    (shard,) = meta.shards
    keys = fmt.prompt_key_digests(fresh)
    keys[[1, 4]] = fmt.prompt_key_digests(base_rows.slice(3, 2))  # rows z1 and z4 claim base prompts 3 and 4
    sidecar = fmt.keys_path(root / "data/tokenized" / shard.filename)
    sidecar.write_bytes(keys.tobytes())
    shard.keys_xxh3_128 = xxhash.xxh3_128_hexdigest(keys.tobytes())
    fmt.write_meta(root / "data/tokenized", meta)
    m = merge(root, base=str(root / "data/bases/legacy"), assume_same_tokenizer=True)
    assert m["overlap"]["dropped_by_prompt_tokens"] == 2 and m["overlap"]["kept"] == 4
    assert "z1" not in fmt.load(root / "data/merged")["id"]


def test_legacy_base_made_with_another_tokenizer_is_caught(world, tmp_path_factory):
    root, info, _, _ = world
    other_dir = train_tokenizer(tmp_path_factory.mktemp("other"), vocab_size=380, seed=7)
    other = write_target(tmp_path_factory.mktemp("t") / "target.json", other_dir)
    legacy = root / "data/bases/legacy"
    write_legacy(legacy, make_rows(other_dir, [f"o{i}" for i in range(20)], seed=3))
    tokenizer = tracked_tokenizer(root, other_dir)
    with pytest.raises(MergeGuardError) as refused:
        merge(root, base=str(legacy), base_tokenizer=str(tokenizer))
    # Named, merge.base_tokenizer gives the fingerprint: refused naming it, both fingerprints and the fixes.
    assert str(refused.value) == (
        f"params.yaml: merge.base_tokenizer ({tokenizer}), named as the maker of merge.base ({legacy}), has tokenizer "
        f"fingerprint {other.tokenizer_fingerprint[:12]}, the target's is {info.tokenizer_fingerprint[:12]}: the "
        "base's token ids mean other tokens under the target; set merge.base to a set tokenized with the target, or "
        "tokenize the base's conversations with it; if the target's tokenizer made the base, set "
        "merge.base_tokenizer: null and merge.assume_same_tokenizer: true (the re-encode check still runs)")
    assert not (root / "data/merged").exists()
    # A wrong claim: the re-encode check finds that the target's tokenizer does not give these ids back.
    with pytest.raises(MergeGuardError, match="re-encode"):
        merge(root, base=str(legacy), assume_same_tokenizer=True)
    assert not (root / "data/merged").exists()


def test_legacy_base_with_its_tokenizer_named(world, tok_dir):
    root, _, base_rows, _ = world
    legacy = root / "data/bases/legacy"
    write_legacy(legacy, base_rows, with_ids=True)
    m = merge(root, base=str(legacy), base_tokenizer=str(tracked_tokenizer(root, tok_dir)))
    assert m["guards"]["tokenizer_claim"] == "base_tokenizer"
    assert m["overlap"]["dropped_by_id"] == 5  # it has ids: the same rows are found by id first
    ds, _, _ = load_training_set(root / "data/merged")
    assert ds["id"][:40] == base_rows.column("id").to_pylist()


@pytest.mark.parametrize(
    "column, values, match",
    [
        ("attention_mask", "ones", "attention_mask"),
        ("labels", "ids_float", "labels"),
        ("loss_mask", "twos", "loss_mask"),
        ("input_ids", "huge", "input_ids"),
        ("num_tokens", "wrong", "num_tokens"),
    ],
)
def test_unsafe_columns_are_refused_naming_the_column(world, column, values, match):
    root, _, base_rows, _ = world
    legacy = root / "data/bases/legacy"
    n = base_rows.num_rows
    lengths = base_rows.column("num_tokens").to_pylist()
    ids = [[int(x) for x in r] for r in base_rows.column("input_ids").to_pylist()]
    mask = [[int(x) for x in r] for r in base_rows.column("loss_mask").to_pylist()]
    cols: dict = {"input_ids": ids, "loss_mask": mask}
    if values == "ones":
        cols[column] = [[1] * k for k in lengths]
    elif values == "ids_float":
        cols[column] = [[float(x) for x in r] for r in ids]
    elif values == "twos":
        cols["loss_mask"] = [[2 * x for x in r] for r in mask]
    elif values == "huge":
        cols["input_ids"] = [r[:-1] + [2**40] for r in ids]
    elif values == "wrong":
        cols["num_tokens"] = [k + 1 for k in lengths]
    save_int64(legacy, cols)
    assert len(cols["input_ids"]) == n
    with pytest.raises(MergeGuardError, match=match):
        merge(root, base=str(legacy), assume_same_tokenizer=True)
    if values == "ones":  # named in merge.drop_columns, the column is dropped instead
        m = merge(root, base=str(legacy), assume_same_tokenizer=True, drop_columns=["attention_mask"])
        assert m["guards"]["dropped_columns"] == ["attention_mask"] and m["merged"]["samples"] == 65


def test_refusals_are_one_line_without_a_traceback(world, capsys):
    """A refused base and a missing input, run as ``stages/merge.py`` runs them: the message alone, exit 1."""
    root, _, base_rows, _ = world
    write_legacy(root / "data/bases/legacy", base_rows)
    argv = [f"--{k}={v}" for k, v in vars(stage_args(root)).items()]
    for params, message in ((merge_params(base=str(root / "data/bases/legacy")), "nothing says which tokenizer"),
                            (merge_params(base=str(root / "legacy")), "is outside"),
                            (merge_params(), "run the tokenize stage first")):
        if message.startswith("run the tokenize"):
            shutil.rmtree(root / "data/tokenized")
        with pytest.raises(SystemExit) as exit_:
            main("merge", MergeArgs, lambda _args, p=params: p, run_merge, argv)
        assert exit_.value.code == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert len([line for line in err.splitlines() if message in line]) == 1
        assert [line for line in err.splitlines() if message in line][0].startswith("merge: ")
    assert not (root / "data/merged").exists() and not (root / "metrics/merge.json").exists()
    with pytest.raises(MissingInput):
        merge(root)
    assert issubclass(MergeGuardError, Refusal) and issubclass(CarryError, Refusal)


def test_unknown_param_is_an_error():
    with pytest.raises(ValueError, match="unknown key"):
        merge_params(bse="x")


def test_real_qwen3_tokenizer_guard(tmp_path, qwen3_tokenizer_dir, tok_dir):
    """Rows made by the real Qwen3 tokenizer pass its re-encode check; rows of another tokenizer claimed as
    Qwen3's (a legacy base with assume_same_tokenizer) are refused."""
    info = write_target(tmp_path / "data/target/target.json", qwen3_tokenizer_dir)
    write_tokenized(tmp_path / "data/tokenized", make_rows(qwen3_tokenizer_dir, ["n0", "n1"], seed=2), info)
    good = tmp_path / "data/bases/good"
    write_legacy(good, make_rows(qwen3_tokenizer_dir, [f"g{i}" for i in range(30)], seed=4, words=40))
    m = merge(tmp_path, base=str(good), base_tokenizer=str(tracked_tokenizer(tmp_path, qwen3_tokenizer_dir)))
    assert m["guards"]["reencode"] == {"checked": 30, "matched": 30}
    bad = tmp_path / "data/bases/bad"
    write_legacy(bad, make_rows(tok_dir, [f"x{i}" for i in range(30)], seed=4, words=40))
    with pytest.raises(MergeGuardError, match="re-encode"):
        merge(tmp_path, base=str(bad), assume_same_tokenizer=True)


# ---------------------------------------------------------------------------------------------- carrying shards


def carried_pairs(root: Path) -> list[tuple[Path, Path]]:
    """(base shard, merged shard) for each carried base shard."""
    base, out = root / "data/bases/r1", root / "data/merged"
    return list(zip([base / f for f in fmt.shard_files(base)], [out / f for f in fmt.shard_files(out)]))


def reflinks_work(folder: Path) -> bool:
    """Whether ``folder``'s filesystem clones files: asked of cp, independently of the code under test."""
    (folder / "probe").write_bytes(b"x" * 4096)
    ok = subprocess.run(["cp", "--reflink=always", folder / "probe", folder / "probe2"], capture_output=True).returncode == 0
    for name in ("probe", "probe2"):
        (folder / name).unlink(missing_ok=True)
    return ok


@pytest.mark.parametrize("mode", ["copy", "hardlink", "auto"])
def test_carry_modes_keep_base_shards_byte_identical_and_read_only(world, mode):
    root, *_ = world
    before = file_hashes(root / "data/bases/r1")
    m = merge(root, base=str(root / "data/bases/r1"), carry=mode)
    pairs = carried_pairs(root)
    assert all(b.read_bytes() == o.read_bytes() for b, o in pairs)
    linked = [os.path.samefile(b, o) for b, o in pairs]
    # tmp_path is in no DVC repository, so auto may link: a reflink where the filesystem clones, else a hardlink.
    want = {"copy": "copy", "hardlink": "hardlink", "auto": "reflink" if reflinks_work(root) else "hardlink"}[mode]
    assert m["carried_by"] == want
    assert all(linked) if want == "hardlink" else not any(linked)
    out = root / "data/merged"
    assert all(stat.S_IMODE((out / f).stat().st_mode) == 0o444 for f in fmt.shard_files(out))
    if os.geteuid() != 0:  # root ignores file modes
        with pytest.raises(PermissionError):
            open(pairs[0][1], "r+b")
    # Writers replace files (temporary name, then rename): a base shard replaced leaves the merged one intact.
    merged_bytes = pairs[0][1].read_bytes()
    tmp = pairs[0][0].with_suffix(".tmp")
    tmp.write_bytes(b"another version")
    os.replace(tmp, pairs[0][0])
    assert pairs[0][1].read_bytes() == merged_bytes
    assert before[pairs[1][0].name] == file_hashes(root / "data/bases/r1")[pairs[1][0].name]


def test_carry_reflink_is_refused_clearly_where_the_filesystem_has_none(world):
    root, *_ = world
    if reflinks_work(root):
        m = merge(root, base=str(root / "data/bases/r1"), carry="reflink")
        assert m["carried_by"] == "reflink" and not any(os.path.samefile(b, o) for b, o in carried_pairs(root))
    else:
        with pytest.raises(CarryError, match="merge.carry: reflink"):
            merge(root, base=str(root / "data/bases/r1"), carry="reflink")
        assert not (root / "data/merged").exists()


def test_auto_links_whatever_dvc_cache_type(world):
    """Under a link cache.type the base's files are cache objects already, and DVC links data/merged to the same
    objects on commit (a copy would be thrown away): auto links there too, as under DVC's default."""
    root, *_ = world
    (root / ".dvc").mkdir()
    for config in ("[cache]\n    type = hardlink,symlink,copy\n", ""):
        (root / ".dvc/config").write_text(config, encoding="utf-8")
        m = merge(root, base=str(root / "data/bases/r1"))
        assert m["carried_by"] in ("reflink", "hardlink")
        if m["carried_by"] == "hardlink":
            assert all(os.path.samefile(b, o) for b, o in carried_pairs(root))


def test_hardlink_across_filesystems_falls_back_to_a_copy(world):
    root, *_ = world
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == root.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp_path")
    elsewhere = Path(tempfile.mkdtemp(dir=shm))  # the bases folder this test passes: on another filesystem
    try:
        shutil.copytree(root / "data/bases/r1", elsewhere / "r1")
        m = merge(root, base=str(elsewhere / "r1"), bases=elsewhere)
        assert m["carried_by"] == "copy" and m["base_shards_carried"] > 0
        with pytest.raises(CarryError, match="merge.carry: hardlink"):
            merge(root, base=str(elsewhere / "r1"), bases=elsewhere, carry="hardlink")
    finally:
        shutil.rmtree(elsewhere)


def test_refused_by_the_reencode_check_after_staging_publishes_nothing(world, tmp_path_factory):
    """The re-encode check runs while the shards are staged; its refusal discards them, links and all."""
    root, info, _, _ = world
    other_dir = train_tokenizer(tmp_path_factory.mktemp("other"), vocab_size=380, seed=7)
    # A draftline.json that claims the target's tokenizer over rows of another: only the re-encode check can tell.
    liar = root / "data/bases/liar"
    write_tokenized(liar, make_rows(other_dir, [f"o{i}" for i in range(30)], seed=3, words=40), info)
    modes = {f: stat.S_IMODE((liar / f).stat().st_mode) for f in fmt.shard_files(liar)}
    with pytest.raises(MergeGuardError, match="re-encode"):
        merge(root, base=str(liar), carry="hardlink")
    assert not (root / "data/merged").exists() and not list(root.glob("data/.merged*"))
    assert {f: stat.S_IMODE((liar / f).stat().st_mode) for f in fmt.shard_files(liar)} == modes


def test_unknown_carry_mode_is_an_error():
    with pytest.raises(ValueError, match="merge.carry"):
        merge_params(carry="symlink")


def test_the_mix_is_labelled_once_and_carried_to_later_rounds(world, tok_dir):
    """Round 1 re-cuts a 77%-code legacy base: its rows are labelled once (from their decoded prompts), the merged
    folder's mix.json records every shard; round 2 merges onto round 1's set and decodes only the new rows."""
    root, info, _, _ = world
    skewed = ["code"] * 77 + ["math"] * 8 + ["tool_use"] * 5 + ["general"] * 10
    write_legacy(root / "data/bases/legacy", chat_rows(tok_dir, skewed))
    shutil.rmtree(root / "data/tokenized")
    fresh = chat_rows(tok_dir, ["math"] * 20 + ["general"] * 20)
    write_tokenized(root / "data/tokenized", fresh.set_column(0, "id", pa.array([f"n{i}" for i in range(40)])), info)
    r1 = merge_run(root, base=str(root / "data/bases/legacy"), assume_same_tokenizer=True)
    mix = r1.details["mix"]
    assert mix["base"]["rows"] == {"code": 77, "general": 10, "math": 8, "tool_use": 5}
    assert mix["merged"]["rows"] == {"code": 77, "general": 30, "math": 28, "tool_use": 5}
    assert mix["merged"]["row_shares"]["code"] == 0.55 and r1.headline["mix"]["code"] == 0.55
    assert r1.run["mix"]["rows_labelled"] == 140  # each row once: the re-cut base shards reuse the base's labels
    shutil.copytree(root / "data/merged", root / "data/bases/round1")
    shutil.rmtree(root / "data/tokenized")
    more = chat_rows(tok_dir, ["tool_use"] * 10)
    write_tokenized(root / "data/tokenized", more.set_column(0, "id", pa.array([f"m{i}" for i in range(10)])), info)
    r2 = merge_run(root, base=str(root / "data/bases/round1"))
    base_shards = len(fmt.read_meta(root / "data/bases/round1").shards)
    assert r2.run["mix"]["shards_recorded"] == base_shards and r2.run["mix"]["rows_labelled"] == 10
    assert r2.details["mix"]["base"] == mix["merged"]
    assert r2.details["mix"]["merged"]["rows"] == {"code": 77, "general": 30, "math": 28, "tool_use": 15}
    assert set(read_record(root / "data/merged")) == {s.xxh3_128 for s in fmt.read_meta(root / "data/merged").shards}
