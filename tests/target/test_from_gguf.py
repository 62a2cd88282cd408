"""A target from a GGUF file: a tiny random Llama written by the test with gguf's writer (a byte-level BPE tokenizer
and a ChatML template in its metadata) is converted into an HF folder that loads with the GGUF's own logits."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from conftest import default_params  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from draftline.core.errors import MissingInput, Refusal  # noqa: E402
from draftline.core.fingerprint import sha256_file  # noqa: E402
from draftline.core.params import ParamsError  # noqa: E402
from draftline.core.runner import execute  # noqa: E402
from draftline.core.target_loader import load_model, load_target, load_tokenizer  # noqa: E402
from draftline.target.from_gguf import convert_gguf, find_gguf  # noqa: E402
from draftline.target.params import TargetParams  # noqa: E402
from draftline.target.stage import TargetArgs, run_target, write_target  # noqa: E402

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS = 2, 64, 128, 4, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|reserved_0|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
Q8_TENSOR = "blk.0.ffn_down.weight"  # not permuted by the Llama conversion, so comparable value for value


def byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_gguf(path: Path, arch: str = "llama", q8: bool = False, note: str = "a", seed: int = 0) -> Path:
    """A 2-layer random Llama as llama.cpp writes one: hyperparameters, a GPT-2-style tokenizer, the template."""
    tokens = byte_tokens() + [m.replace(" ", "") for m in MERGES] + SPECIALS
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("draftline tiny llama")
    w.add_string("draftline.note", note)  # read by nothing: only the file's bytes see it
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(vocab, HIDDEN))
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + rand(HIDDEN))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + rand(HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(FFN, HIDDEN))
        down = rand(HIDDEN, FFN)
        if q8 and i == 0:
            qtype = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(f"blk.{i}.ffn_down.weight", gguf.quants.quantize(down, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(f"blk.{i}.ffn_down.weight", down)
    w.add_tensor("output_norm.weight", 1 + rand(HIDDEN))
    w.add_tensor("output.weight", rand(vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_dir(root: Path, name: str = "tiny.gguf", **kwargs) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_gguf(root / name, **kwargs)
    return root


def files(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny GGUF and its float32 conversion."""
    root = tmp_path_factory.mktemp("gguf")
    src = gguf_dir(root / "src")
    record = convert_gguf(src / "tiny.gguf", root / "model", "float32")
    return src / "tiny.gguf", root / "model", record


def test_the_converted_folder_loads_with_the_gguf_logits_and_chat_template(converted):
    file, model_dir, record = converted
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(files(model_dir))
    assert record.file == "tiny.gguf" and record.dtype == "float32"
    data = file.read_bytes()  # the record against the file's bytes, hashed here, not by the code under test
    assert record.sha256 == hashlib.sha256(data).hexdigest() and record.bytes == len(data)

    reference = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    assert model.config.num_hidden_layers == LAYERS and model.dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "the theory"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert tok.decode(ids[0]) == "<|im_start|>user\nthe theory<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("Ġthe") in ids[0].tolist()  # the merges came through
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)


def test_a_q8_0_tensor_converts_to_bfloat16(tmp_path):
    src = gguf_dir(tmp_path / "src", q8=True)
    convert_gguf(src / "tiny.gguf", tmp_path / "model", "bfloat16")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), local_files_only=True)
    assert model.dtype == torch.bfloat16
    tensor = next(t for t in gguf.GGUFReader(src / "tiny.gguf").tensors if t.name == Q8_TENSOR)
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
    expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy()).to(torch.bfloat16)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, expected)


def test_two_conversions_are_byte_identical(converted, tmp_path):
    file, model_dir, record = converted
    again = convert_gguf(file, tmp_path / "again", "float32")
    assert again == record and files(tmp_path / "again") == files(model_dir)


def test_find_gguf_takes_a_file_or_a_folder_with_exactly_one(tmp_path):
    src = gguf_dir(tmp_path / "one")
    assert find_gguf(src) == find_gguf(src / "tiny.gguf") == src / "tiny.gguf"
    (tmp_path / "none").mkdir()
    for path, error, words in [
        (tmp_path / "none", MissingInput, "holds no .gguf file"),
        (gguf_dir(gguf_dir(tmp_path / "two"), "other.gguf"), Refusal, "holds 2 .gguf files (other.gguf, tiny.gguf)"),
        (tmp_path / "missing.gguf", MissingInput, "does not exist"),
    ]:
        with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
            find_gguf(path)
        assert "\n" not in str(e.value)


def test_an_architecture_transformers_cannot_load_is_refused_in_one_line(tmp_path):
    src = gguf_dir(tmp_path, arch="draftnet")
    with pytest.raises(Refusal, match="GGUF architecture 'draftnet' is not one transformers can load") as e:
        convert_gguf(src / "tiny.gguf", tmp_path / "model", "float32")
    assert "\n" not in str(e.value) and not (tmp_path / "model").exists()


def test_the_stage_converts_a_gguf_into_model_and_records_it(converted, tmp_path):
    file, model_dir, record = converted
    params = TargetParams.parse(default_params("target", path=str(file.parent)), "target")
    args = TargetArgs(conversations=tmp_path / "absent", out=tmp_path / "target", metrics=tmp_path / "metrics.json",
                      report=tmp_path / "report.json", plot=tmp_path / "loss.csv")
    execute("target", run_target, params, args)
    assert files(tmp_path / "target" / "model") == files(model_dir)
    data = json.loads((tmp_path / "target" / "target.json").read_text())
    # The record names the file llama.cpp serves where it lies (an absolute target.path is kept as given).
    assert data["gguf"] == {**record.to_dict(), "path": str(file)} and data["path"] == "model" and not data["embedded"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gguf"] == data["gguf"] and report["num_hidden_layers"] == LAYERS
    info = load_target(tmp_path / "target" / "target.json")
    assert (info.num_hidden_layers, info.hidden_size, info.end_of_turn_token) == (LAYERS, HIDDEN, "<|im_end|>")
    tok = load_tokenizer(info)
    assert tok.convert_ids_to_tokens(info.mask_token_id) == "<|reserved_0|>"
    assert load_model(info).config.num_hidden_layers == LAYERS

    # One metadata byte the conversion never reads: the same converted folder, another fingerprint.
    flipped = gguf_dir(tmp_path / "flipped", note="b")
    write_target(TargetParams.parse(default_params("target", path=str(flipped / "tiny.gguf")), "target"),
                 tmp_path / "target2")
    other = json.loads((tmp_path / "target2" / "target.json").read_text())
    assert files(tmp_path / "target2" / "model") == files(model_dir)
    assert other["gguf"]["sha256"] != record.sha256
    assert other["model_fingerprint"] != data["model_fingerprint"]
    assert other["tokenizer_fingerprint"] == data["tokenizer_fingerprint"]
    # The GGUF's bytes count, not where it lies: the same file in another folder, the same fingerprint.
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(file, moved / file.name)
    write_target(TargetParams.parse(default_params("target", path=str(moved / file.name)), "target"),
                 tmp_path / "target3")
    assert json.loads((tmp_path / "target3" / "target.json").read_text())["model_fingerprint"] == data["model_fingerprint"]


def test_the_stage_refuses_a_bad_dtype_naming_the_param(converted):
    file, _, _ = converted
    with pytest.raises(ParamsError, match=r"target\.gguf_dtype must be one of \['float32', 'bfloat16', 'float16'\]"):
        TargetParams.parse(default_params("target", path=str(file), gguf_dtype="int8"), "target")


def test_a_gguf_target_needs_its_dtype_and_its_extra(converted, tmp_path, monkeypatch):
    file, _, _ = converted
    values = default_params("target", path=str(file))
    del values["gguf_dtype"]
    with pytest.raises(ParamsError, match="target.gguf_dtype is missing"):
        write_target(TargetParams.parse(values, "target"), tmp_path / "target")
    monkeypatch.setitem(sys.modules, "accelerate", None)  # as if not installed
    with pytest.raises(Refusal, match=r"needs the 'accelerate' package: pip install -e '\.\[gguf\]'"):
        convert_gguf(file, tmp_path / "model", "float32")
    assert not (tmp_path / "target").exists() and not (tmp_path / "model").exists()
