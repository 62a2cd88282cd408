"""The on-disk dataset contract: save_to_disk-compatible shards, size limits, determinism, metadata checks."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pyarrow as pa
import pytest

from draftline.core import dataset as df


def rows(n: int, seed: int = 0, max_len: int = 300) -> pa.Table:
    rng = np.random.default_rng(seed)
    lens = rng.integers(2, max_len, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    ids = rng.integers(0, 151_000, size=offsets[-1])
    mask = rng.random(offsets[-1]) < 0.7
    return df.build_table([f"r{i}" for i in range(n)], ["src"] * n, offsets, ids, mask)


def meta() -> df.DatasetMeta:
    return df.DatasetMeta("tok-fp", "tmpl-sha", False, 4096, mask_token_id=151656, end_of_turn_token_id=151645)


def test_build_table_columns_and_counts():
    t = df.build_table(["a", "b"], ["s", "t"], np.array([0, 3, 5]), np.array([7, 8, 9, 10, 11]), np.array([0, 1, 1, 1, 0], bool))
    assert t.schema.equals(df.SCHEMA)
    assert t.to_pylist() == [
        {"id": "a", "source": "s", "input_ids": [7, 8, 9], "loss_mask": [False, True, True], "num_tokens": 3, "num_loss_tokens": 2},
        {"id": "b", "source": "t", "input_ids": [10, 11], "loss_mask": [True, False], "num_tokens": 2, "num_loss_tokens": 1},
    ]
    with pytest.raises(ValueError):
        df.build_table(["a"], ["s"], np.array([0, 3]), np.array([1, 2]), np.array([1, 0], bool))


def test_counts_per_row_with_empty_rows_anywhere():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5, size=200)
    lengths[:3] = 0
    lengths[-2:] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    mask = rng.random(offsets[-1]) < 0.5
    table = df.build_table([str(i) for i in range(200)], ["s"] * 200, offsets, np.arange(offsets[-1]), mask)
    assert table.column("num_tokens").to_pylist() == lengths.tolist()
    expected = [int(mask[offsets[i] : offsets[i + 1]].sum()) for i in range(200)]
    assert table.column("num_loss_tokens").to_pylist() == expected


def test_shards_limit_determinism_and_memory_mapped_load(tmp_path):
    table = rows(600)
    limit = 60_000
    # Same rows arriving in different chunks give the same bytes.
    m1 = df.write_dataset(tmp_path / "a", [table], meta(), max_shard_bytes=limit)
    m2 = df.write_dataset(tmp_path / "b", [table.slice(0, 7), table.slice(7, 300), table.slice(307)], meta(), max_shard_bytes=limit)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert len(m1.shards) > 3 and m1.to_dict() == m2.to_dict()
    assert all(s.num_bytes <= limit for s in m1.shards)
    assert df.shard_files(tmp_path / "a") == [s.filename for s in m1.shards] == [df.shard_name(i, len(m1.shards)) for i in range(len(m1.shards))]

    ds = df.load(tmp_path / "a")
    assert isinstance(ds, datasets.Dataset) and len(ds) == 600
    assert len(ds.cache_files) == len(m1.shards)  # memory-mapped shard files, not an in-memory copy
    assert ds.features == df.FEATURES
    assert ds[599] == table.slice(599).to_pylist()[0]
    assert m1.num_tokens == sum(table.column("num_tokens").to_pylist())
    # the plain datasets API opens it too
    assert len(datasets.load_from_disk(str(tmp_path / "a"))) == 600


def test_bytes_per_token_at_realistic_lengths(tmp_path):
    m = df.write_dataset(tmp_path / "d", [rows(200, max_len=3000)], meta())
    # int32 ids (4) + a bit-packed mask (1/8) + per-row offsets and counts
    assert 4.125 < m.shards[0].num_bytes / m.num_tokens < 4.2


def test_a_row_larger_than_the_limit_gets_its_own_shard(tmp_path):
    m = df.write_dataset(tmp_path / "x", [rows(3, max_len=300)], meta(), max_shard_bytes=10)
    assert [s.num_rows for s in m.shards] == [1, 1, 1]


def test_empty_dataset_loads(tmp_path):
    m = df.write_dataset(tmp_path / "e", [], meta())
    assert m.num_rows == 0 and len(df.load(tmp_path / "e")) == 0


def test_meta_round_trip_version_and_compatibility(tmp_path):
    df.write_dataset(tmp_path / "d", [rows(5)], meta())
    got = df.read_meta(tmp_path / "d")
    assert got.num_rows == 5 and got.shards[0].num_rows == 5 and got.enable_thinking is False
    other = meta()
    other.enable_thinking = True
    with pytest.raises(ValueError, match="enable_thinking"):
        got.check_compatible(other)
    got.check_compatible(meta())

    raw = json.loads((tmp_path / "d" / df.META_FILE).read_text())
    raw["schema_version"] = df.SCHEMA_VERSION + 1
    (tmp_path / "d" / df.META_FILE).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="schema_version"):
        df.load(tmp_path / "d")
    with pytest.raises(FileNotFoundError):
        df.read_meta(tmp_path / "missing")


def test_failed_write_leaves_the_previous_folder(tmp_path):
    df.write_dataset(tmp_path / "d", [rows(5)], meta())

    def broken():
        yield rows(3)
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        df.write_dataset(tmp_path / "d", broken(), meta())
    assert len(df.load(tmp_path / "d")) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def corrupt(path, how: str) -> None:
    """Damage a shard as a bad copy or bad storage would (shards may be read-only, as merge leaves them)."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # one bit flipped in the middle of the token data: same size, still a readable Arrow stream
        data[len(data) // 2] ^= 0x04
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "bitflip"])
def test_a_damaged_shard_is_refused_by_name(tmp_path, how):
    m = df.write_dataset(tmp_path / "ds", [rows(200)], meta(), max_shard_bytes=40_000)
    assert all(s.xxh3_128 for s in m.shards) and len(m.shards) > 2
    df.verify_shards(tmp_path / "ds", df.read_meta(tmp_path / "ds"))
    victim = tmp_path / "ds" / m.shards[1].filename
    corrupt(victim, how)
    with pytest.raises(df.CorruptShardError, match=m.shards[1].filename):
        df.load(tmp_path / "ds")


def test_prompt_keys_are_recorded_beside_each_shard_and_read_back(tmp_path):
    """Every shard gets a sidecar of its rows' prompt keys, checksummed in draftline.json; the shard files stay
    exactly what datasets reads (no extra column)."""
    table = rows(300)
    m = df.write_dataset(tmp_path / "ds", [table], meta(), max_shard_bytes=40_000)
    assert len(m.shards) > 2 and all(s.keys_xxh3_128 for s in m.shards)
    for s in m.shards:
        assert df.keys_path(tmp_path / "ds" / s.filename).stat().st_size == df.KEY_BYTES * s.num_rows
    keys = df.read_keys(tmp_path / "ds", df.read_meta(tmp_path / "ds"))
    assert keys.shape == (300, df.KEY_BYTES) and np.array_equal(keys, df.prompt_key_digests(table))
    # The key is the hash of the tokens before the first supervised one, as little-endian int32.
    import xxhash

    first = table.slice(7, 1).to_pylist()[0]
    cut = first["loss_mask"].index(True) if True in first["loss_mask"] else len(first["loss_mask"])
    assert keys[7].tobytes() == xxhash.xxh3_128_digest(np.array(first["input_ids"][:cut], "<i4").tobytes())
    assert datasets.load_from_disk(str(tmp_path / "ds")).column_names == list(df.FEATURES)


@pytest.mark.parametrize("how", ["truncate", "bitflip", "missing"])
def test_a_damaged_key_record_is_refused_by_name(tmp_path, how):
    m = df.write_dataset(tmp_path / "ds", [rows(200)], meta(), max_shard_bytes=40_000)
    victim = df.keys_path(tmp_path / "ds" / m.shards[1].filename)
    if how == "missing":
        victim.unlink()
    else:
        corrupt(victim, how)
    with pytest.raises(df.CorruptShardError, match=victim.name):
        df.load(tmp_path / "ds")


def test_training_set_is_verified_and_named_by_its_metadata(tmp_path):
    m = df.write_dataset(tmp_path / "ds", [rows(50)], meta(), max_shard_bytes=40_000)
    np.save(tmp_path / "ds" / df.ORDER_FILE, df.training_order(m.num_rows, 0))
    digest = df.dataset_digest(tmp_path / "ds")
    np.save(tmp_path / "ds" / df.ORDER_FILE, df.training_order(m.num_rows, 1))
    assert df.dataset_digest(tmp_path / "ds") != digest  # another order is other training data
    corrupt(tmp_path / "ds" / m.shards[0].filename, "bitflip")
    with pytest.raises(df.CorruptShardError, match="do not match"):
        df.load_training_set(tmp_path / "ds")


def test_a_full_disk_is_named_whatever_library_was_writing(small_disk):
    """pyarrow, torch and safetensors each wrap ENOSPC their own way; every one surfaces as DiskFullError."""
    import torch
    from safetensors.torch import save_file

    from draftline.core.files import DiskFullError, atomic_path

    def torch_save(path):
        with open(path, "wb") as f:  # as train.state saves
            torch.save({"w": torch.zeros(20_000)}, f)

    disk = small_disk(4096)
    writers = {
        "arrow": lambda p: df.write_dataset(p, [rows(300)], meta()),
        "torch": torch_save,
        "safetensors": lambda p: save_file({"w": torch.zeros(20_000)}, str(p)),
    }
    for name, write in writers.items():
        with pytest.raises(DiskFullError, match=f"{name} output"):
            with atomic_path(disk.path / name, f"{name} output") as tmp:
                write(tmp)
        assert list(disk.path.iterdir()) == [], name
