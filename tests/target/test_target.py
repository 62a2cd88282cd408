"""The target stage: fingerprints, a real Qwen3 tokenizer folder as the target, and the embedded target."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import TINY_TARGET_PARAMS, WEATHER_TOOL, default_params, tiny_conversations

from draftline.conversations.params import ConversationsParams, ConversationsSettings
from draftline.conversations.stage import ConversationsArgs, run_conversations
from draftline.core.errors import Refusal
from draftline.core.fingerprint import SAMPLE_BLOCK, SAMPLE_EDGE, model_fingerprint, sha256_file, tokenizer_fingerprint
from draftline.core.params import ParamsError
from draftline.core.records import Conversation
from draftline.core.runner import execute, run_file
from draftline.core.source_spec import SourceSpec
from draftline.core.target_loader import load_model, load_target, load_tokenizer
from draftline.sources.stage import SourceArgs, run_source
from draftline.target.describe import describe_target
from draftline.target.params import EmbeddedParams, TargetParams
from draftline.target.stage import TargetArgs, run_target, write_target


def target_params(params: dict | None = None, **overrides) -> TargetParams:
    """params.yaml's target section with ``overrides`` (or ``params`` whole, e.g. the tiny embedded one)."""
    return TargetParams.parse(params if params is not None else default_params("target", **overrides), "target")


def target_args(root: Path, out: Path, conversations: Path | None = None) -> TargetArgs:
    return TargetArgs(conversations=conversations or root / "conversations", out=out, metrics=root / "metrics.json",
                      report=root / "report.json", plot=root / "loss.csv")

QWEN3_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def copy_tokenizer(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in QWEN3_TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)
    return dst


def folder_digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ fingerprints


def test_fingerprint_same_files_same_fingerprint_one_changed_merge_differs(qwen3_tokenizer_dir, tmp_path):
    template = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    original = tokenizer_fingerprint(qwen3_tokenizer_dir, template)
    copy = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "copy")
    assert tokenizer_fingerprint(copy, template) == original  # the folder's path does not count

    changed = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "changed")
    lines = (changed / "merges.txt").read_text(encoding="utf-8").split("\n")
    last = max(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    a, b = lines[last].split(" ")
    lines[last] = f"{b} {a}"  # one merge rule changed, everything else byte-identical
    (changed / "merges.txt").write_text("\n".join(lines), encoding="utf-8")
    assert tokenizer_fingerprint(changed, template) != original

    # The chat template counts too, wherever transformers took it from.
    assert tokenizer_fingerprint(copy, template + " ") != original


def save_checkpoint(folder: Path, seed: int) -> Path:
    """A config and 16 MiB of random float32 weights (seed ``seed``) in one safetensors file: the shapes alone are
    the same for every seed."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 1024}')
    g = torch.Generator().manual_seed(seed)
    save_file({"embed": torch.randn(4096, 1024, generator=g), "head": torch.randn(16, 1024, generator=g)},
              folder / "model.safetensors")
    return folder


def test_the_cheap_model_fingerprint_tells_same_shaped_weights_apart_and_keeps_a_copys(tmp_path):
    """``hash_weights: false``: two checkpoints of the same shapes (same file sizes), other weights, get other
    fingerprints; the same file copied elsewhere, with another mtime, the same one; a byte flipped in a sampled block
    changes it."""
    a, b = save_checkpoint(tmp_path / "a", 0), save_checkpoint(tmp_path / "b", 1)
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    cheap = model_fingerprint(a, hash_weights=False)
    assert model_fingerprint(b, hash_weights=False) != cheap
    copy = Path(shutil.copytree(a, tmp_path / "elsewhere" / "a"))
    weights = copy / "model.safetensors"
    os.utime(weights, ns=(0, 0))  # another mtime: a copy's time is not its content
    assert model_fingerprint(copy, hash_weights=False) == cheap
    data = bytearray(weights.read_bytes())
    data[SAMPLE_EDGE + SAMPLE_BLOCK // 2] ^= 1  # inside the first strided block, past the header's MiB
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy, hash_weights=False) != cheap
    assert model_fingerprint(copy) != model_fingerprint(a)  # every byte read: a change anywhere


def test_describe_sees_a_changed_template_and_load_tokenizer_refuses_a_changed_folder(qwen3_tokenizer_dir, tmp_path):
    folder = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "tok")
    write_target(target_params(path=str(folder)), tmp_path / "target")
    info = load_target(tmp_path / "target" / "target.json")
    assert load_tokenizer(info).eos_token_id == 151645

    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("# Tools", "# Functions")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    changed = describe_target(folder)
    assert changed.chat_template_sha256 != info.chat_template_sha256
    assert changed.tokenizer_fingerprint != info.tokenizer_fingerprint
    with pytest.raises(ValueError, match="changed since the target stage"):
        load_tokenizer(info)


# ---------------------------------------------------------------------------------------- a real Qwen3 tokenizer


@pytest.mark.parametrize(("closing", "expected"), [
    ("<|im_end|>", ("<|im_end|>", 151645)),        # ChatML (Qwen3, SmolLM2)
    ("<|box_end|>", ("<|box_end|>", 151649)),      # another one-token close, as Llama 3's <|eot_id|>
    ("\n<|im_end|>", ("<|im_end|>", 151645)),      # whitespace before the close: still the close, not eos
    ("\n\n", ("<|endoftext|>", 151643)),           # plain text closes the turn: eos
])
def test_the_end_of_turn_is_read_from_the_template(qwen3_tokenizer_dir, tmp_path, closing, expected):
    folder = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "tok")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '" + closing.replace("\n", "\\n")
                            + "' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    cfg["eos_token"] = "<|endoftext|>"  # apart from every close above
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    info = describe_target(folder)
    assert (info.end_of_turn_token, info.end_of_turn_token_id) == expected


def test_a_template_that_cannot_render_a_reply_is_refused_in_one_line(qwen3_tokenizer_dir, tmp_path):
    folder = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "tok")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ raise_exception('assistant turns are not supported') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(Refusal, match="cannot render a user turn and an assistant reply .*not supported") as e:
        describe_target(folder)
    assert "\n" not in str(e.value)


def test_qwen3_tokenizer_folder_as_target(qwen3_tokenizer_dir, tmp_path):
    target_dir = tmp_path / "data" / "target"
    execute("target", run_target, target_params(path=str(qwen3_tokenizer_dir)), target_args(tmp_path, target_dir))
    assert sorted(p.name for p in target_dir.iterdir()) == ["target.json"]  # used in place, nothing copied
    raw = json.loads((target_dir / "target.json").read_text())
    assert raw["eos_token"] == "<|im_end|>" and raw["eos_token_id"] == 151645
    assert raw["pad_token_id"] == 151643
    assert raw["end_of_turn_token"] == "<|im_end|>" and raw["end_of_turn_token_id"] == 151645
    assert (raw["think_start_token"], raw["think_end_token"]) == ("<think>", "</think>")
    assert raw["mask_token_id"] == 151656  # <|video_pad|>: the highest special token the template never writes
    assert raw["vocab_size"] == 151669  # no config.json: the tokenizer's own size
    assert raw["num_hidden_layers"] is None and raw["hidden_size"] is None and raw["model_fingerprint"] is None
    assert raw["embedded"] is False
    template = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert raw["tokenizer_fingerprint"] == tokenizer_fingerprint(qwen3_tokenizer_dir, template)

    info = load_target(target_dir / "target.json")
    assert Path(info.path) == qwen3_tokenizer_dir.absolute()
    tok = load_tokenizer(info)
    assert tok.convert_ids_to_tokens(info.mask_token_id) == "<|video_pad|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert info.mask_token_id not in tok(text).input_ids
    with pytest.raises(ValueError, match="no model weights"):
        load_model(info)
    assert json.loads((tmp_path / "report.json").read_text())["embedded"] is False
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"skipped": 0}  # no build: no figures
    assert (tmp_path / "loss.csv").read_text() == "step,loss,lr,tokens,reply_tokens\n"


def test_config_json_fields_and_mask_token_override(qwen3_tokenizer_dir, tmp_path):
    folder = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "ckpt")
    # Multimodal checkpoints (Qwen3.5 / 3.6) keep the text model's fields under text_config.
    (folder / "config.json").write_text(
        json.dumps({"model_type": "qwen3_vl", "text_config": {"num_hidden_layers": 36, "hidden_size": 4096, "vocab_size": 151936}})
    )
    info = describe_target(folder)
    assert (info.num_hidden_layers, info.hidden_size, info.vocab_size) == (36, 4096, 151936)
    assert describe_target(folder, mask_token_id=151669).mask_token_id == 151669  # a padding row of the embedding
    with pytest.raises(ValueError, match="outside the embedding"):
        describe_target(folder, mask_token_id=151936)
    with pytest.raises(ValueError, match="eos/pad"):
        describe_target(folder, mask_token_id=151645)
    with pytest.raises(ValueError, match="ordinary vocabulary token"):
        describe_target(folder, mask_token_id=1000)
    with pytest.raises(ValueError, match="chat template writes"):
        describe_target(folder, mask_token_id=151667)  # <think>
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="no\\s+config.json"):
        describe_target(folder, mask_token_id=151669)


def test_bad_target_paths_fail_clearly(qwen3_tokenizer_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        describe_target(tmp_path / "missing")
    folder = copy_tokenizer(qwen3_tokenizer_dir, tmp_path / "notemplate")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        write_target(target_params(path=str(folder)), tmp_path / "target")
    assert not (tmp_path / "target").exists()  # nothing half-written
    with pytest.raises(ParamsError, match="unknown key"):
        EmbeddedParams.parse({**TINY_TARGET_PARAMS["embedded"], "layers": 4}, "target.embedded")
    with pytest.raises(ParamsError, match="num_layers must be >= 4"):
        EmbeddedParams.parse({**TINY_TARGET_PARAMS["embedded"], "num_layers": 2}, "target.embedded")


# ------------------------------------------------------------------------------------------- the embedded target


def test_embedded_target_round_trips_through_auto_classes(embedded_target):
    import torch
    from transformers import Qwen3ForCausalLM

    info = load_target(embedded_target / "target.json")
    assert info.embedded and Path(info.path) == embedded_target / "model"
    tok = load_tokenizer(info)
    model = load_model(info, dtype=torch.float32)
    assert isinstance(model, Qwen3ForCausalLM)
    assert model.config.num_hidden_layers == info.num_hidden_layers >= 4
    assert model.config.hidden_size == info.hidden_size
    assert model.get_input_embeddings().weight.shape[0] == info.vocab_size >= len(tok)

    for token in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_response>"):
        assert len(tok(token, add_special_tokens=False).input_ids) == 1, token
    assert tok.eos_token == info.eos_token == "<|im_end|>" and tok.eos_token_id == info.end_of_turn_token_id
    assert tok.convert_ids_to_tokens(info.pad_token_id) == "<|endoftext|>"
    assert tok.convert_ids_to_tokens(info.mask_token_id) == "<|reserved_3|>"
    text = "def f(x):\n    return 42 * x  # 中文 ok"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text

    corpus = [tok.apply_chat_template(c.messages, tools=c.tools, tokenize=False) for c in tiny_conversations(8)]
    ids = tok(corpus, add_special_tokens=False).input_ids
    assert all(info.mask_token_id not in row for row in ids)
    logits = model(torch.tensor([ids[0]])).logits
    assert logits.shape == (1, len(ids[0]), info.vocab_size)

    # Training took: the loss fell, and greedy output ends its reply with the end-of-turn token's patterns.
    prompt = tok.apply_chat_template(
        tiny_conversations(1)[0].messages[:1], add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    out = model.generate(tok(prompt, return_tensors="pt").input_ids, max_new_tokens=6, do_sample=False)
    assert out.shape[1] > len(tok(prompt).input_ids)


def test_embedded_build_is_deterministic_and_seeded_and_the_same_on_two_ranks(embedded_target, tmp_path):
    """Built again on two processes (each computing one of the two parts of every step): the same bytes as on one."""
    again = tmp_path / "again"
    two_ranks = {**TINY_TARGET_PARAMS, "embedded": {**TINY_TARGET_PARAMS["embedded"], "workers": 2}}
    write_target(target_params(two_ranks), again, tiny_conversations())
    assert folder_digests(again) == folder_digests(embedded_target)

    other = tmp_path / "seed1"
    write_target(target_params({**TINY_TARGET_PARAMS, "seed": 1}), other, tiny_conversations())
    a, b = load_target(embedded_target / "target.json"), load_target(other / "target.json")
    assert a.tokenizer_fingerprint == b.tokenizer_fingerprint  # the tokenizer depends on the corpus only
    assert a.model_fingerprint != b.model_fingerprint


def test_the_corpus_is_each_first_exchange_as_generation_sends_it(embedded_target):
    """The prompt is the generation prompt byte for byte (thinking off); the reply is the first assistant turn
    without its reasoning, up to its end of turn; examples over max_len are counted skips, never cut."""
    from draftline.core.chat import render
    from draftline.core.logs import get_logger
    from draftline.core.skips import Skips
    from draftline.target.embedded.build import first_exchange, training_examples

    tok = load_tokenizer(load_target(embedded_target / "target.json"))
    convs = tiny_conversations(8)
    for conv in convs:
        ex = first_exchange(tok, conv)
        first = next(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
        prompt = render(tok, conv.messages[:first], conv.tools, enable_thinking=False, generation_prompt=True)
        assert tok.decode(ex.prompt) == prompt and prompt.endswith("<think>\n\n</think>\n\n")
        reply = tok.decode(ex.reply)
        assert reply.endswith("<|im_end|>") and reply.count("<|im_end|>") == 1 and "<think>" not in reply
        if conv.tools:
            assert reply.startswith('<tool_call>\n{"name": "get_weather"')
    assert first_exchange(tok, Conversation("x", 0, [{"role": "user", "content": "hi"}])) is None

    skips = Skips(get_logger("test"))
    longest = max(len(first_exchange(tok, c)) for c in convs)
    kept = training_examples(tok, convs, longest - 1, skips)
    assert 0 < skips.counts["too_long"] == len(convs) - sum(map(len, kept.values()))
    assert all(len(e) <= longest - 1 for exs in kept.values() for e in exs)

    # A reply the template cannot render costs that example, counted, never the build.
    broken = Conversation("x", 1, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "tool_calls": "x"}])
    assert training_examples(tok, [broken, convs[0]], 4096, skips) == {convs[0].source: [first_exchange(tok, convs[0])]}
    assert skips.counts["first_exchange_error"] == 1


def test_batches_take_one_source_within_the_budget_and_label_replies_only():

    from draftline.target.embedded.build import IGNORE, Example, _SourceBatches

    examples = {"a": [Example([1, 2, 3], [4, 5]), Example([1, 2], [6])], "b": [Example([7] * 10, [8, 9])]}
    batches = _SourceBatches(examples, {"b": 0.0}, batch_tokens=12, pad=0, seed=0)
    for _ in range(6):  # weight 0: source b is never drawn
        [(ids, labels)] = batches.next(1)
        assert ids.shape[0] * ids.shape[1] <= 12 and set(ids.flatten().tolist()) <= {0, 1, 2, 3, 4, 5, 6}
        for row, lab in zip(ids.tolist(), labels.tolist()):
            n = sum(t != 0 for t in row)  # right-padded with pad=0
            assert all(t == 0 for t in row[n:])
            # position t is trained to predict token t + 1, and only where that token is the reply's
            supervised = [row[t + 1] for t in range(n - 1) if lab[t] != IGNORE]
            assert supervised in ([4, 5], [6]) and all(x == IGNORE for x in lab[n - 1:])
    one, empty = _SourceBatches({"b": examples["b"]}, {}, batch_tokens=12, pad=0, seed=0).next(2)
    assert one[0].shape == (1, 12) and empty is None  # a batch always holds one example, even one as long as the budget
    # In parts: row i in part i % parts, each part padded to its own longest row.
    first, second = _SourceBatches({"a": examples["a"] * 2}, {}, batch_tokens=20, pad=0, seed=0).next(2)
    assert first[0].shape[0] == second[0].shape[0] == 2 and {first[0].shape[1], second[0].shape[1]} <= {3, 5}


def test_embedded_stage_from_raw_sources(tmp_path):
    """The stage end to end: raw rows -> the conversations stage -> the embedded target, metrics and loss curve."""
    rows = [
        {"id": i, "conversations": [{"from": "human", "value": f"What is {i % 9} times 3?"},
                                    {"from": "gpt", "value": f"{i % 9} times 3 is {3 * (i % 9)}."}]}
        for i in range(80)
    ]
    src_file = tmp_path / "chats.jsonl"
    src_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = SourceSpec.parse({"path": str(src_file), "adapter": "infinity_instruct"}, "sources.chats")
    execute("sources", run_source, spec, SourceArgs(source="chats", out=tmp_path / "raw/chats", report=tmp_path / "s.json"))
    settings = ConversationsSettings(spec, ConversationsParams.parse(default_params("conversations"), "conversations"))
    execute("conversations", run_conversations, settings, ConversationsArgs(
        source="chats", raw=tmp_path / "raw/chats", out=tmp_path / "conversations/chats", report=tmp_path / "c.json"))

    stage = execute("target", run_target, target_params(TINY_TARGET_PARAMS), target_args(tmp_path, tmp_path / "target"))
    info = load_target(tmp_path / "target" / "target.json")
    assert info.embedded and info.num_hidden_layers == 4
    metrics = json.loads((tmp_path / "report.json").read_text())
    held = metrics["held_out"]
    headline = json.loads((tmp_path / "metrics.json").read_text())
    assert headline == stage.headline | {"skipped": 0} and set(headline) == {"final_loss", "runaway", "tool_calls", "skipped"}
    assert headline["final_loss"] == metrics["final_loss"] and 0 <= headline["runaway"] <= 1
    # How fast this machine built it is the run's, never the results'.
    assert {"train_s", "tokens_per_s", "stage_seconds"} <= set(json.loads(run_file(tmp_path / "report.json").read_text()))
    assert not {"train_s", "tokens_per_s", "wall_s"} & set(metrics)
    assert metrics["corpus_conversations"] + sum(r["prompts"] for r in held.values()) == 80
    assert held and all(r["prompts"] == 1 and 0 <= r["runaway"] <= 1 for r in held.values())
    assert 5e4 < metrics["parameters"] < 5e5 and metrics["final_loss"] < metrics["first_loss"]
    with open(tmp_path / "loss.csv") as f:
        curve = list(csv.DictReader(f))
    assert [int(r["step"]) for r in curve] == list(range(1, TINY_TARGET_PARAMS["embedded"]["steps"] + 1))
    samples = [json.loads(line) for line in (tmp_path / "target" / "held_out.jsonl").read_text().splitlines()]
    assert sorted(s["source"] for s in samples) == sorted(held)
    assert all(s["prompt"].endswith("<think>\n\n</think>\n\n") for s in samples)

    with pytest.raises(FileNotFoundError, match="dvc repro conversations"):
        execute("target", run_target, target_params(TINY_TARGET_PARAMS),
                target_args(tmp_path / "second", tmp_path / "t2", tmp_path / "absent"))


# --------------------------------------------------------------------------------------------- the chat template

CHATS = [
    # system, multi-turn, reasoning on the last turn and on an earlier one (which Qwen3 drops)
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
      {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6", "reasoning_content": "three and three"}],
     None),
    # reasoning carried inside content
    ([{"role": "user", "content": "x?"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\ny"}], None),
    # tools, two tool calls (dict and string arguments), two tool results, then the answer
    ([{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Oslo and Lima?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
          {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}}]},
      {"role": "tool", "content": "cold"}, {"role": "tool", "content": "warm"},
      {"role": "assistant", "content": "Oslo is cold, Lima warm.", "reasoning_content": "read both"}],
     [WEATHER_TOOL]),
    # a tool call with no content and no system prompt
    ([{"role": "user", "content": "Weather in Cairo?"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Cairo"}}}]},
      {"role": "tool", "content": "hot"}],
     [WEATHER_TOOL]),
]

TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", re.S)


def structure(text: str) -> tuple[list[tuple[str, str]], str]:
    """``(turns, rest)``: the ChatML turns as (role, body), back to back from the start, and what follows them
    (the generation prompt). A system turn with tools keeps its system prompt and tool lines, not the wording."""
    turns, pos = [], 0
    while m := TURN.match(text, pos):
        role, body = m.groups()
        if role == "system" and "<tools>" in body:
            body = body.split("# Tools")[0] + "<tools>" + body.split("<tools>\n")[1].split("\n</tools>")[0] + "</tools>"
        turns.append((role, body))
        pos = m.end()
    return turns, text[pos:]


@pytest.mark.parametrize("index", range(len(CHATS)))
def test_embedded_template_renders_the_structure_of_qwen3(embedded_target, qwen3_tokenizer_dir, index):
    from transformers import AutoTokenizer

    ours = load_tokenizer(load_target(embedded_target / "target.json"))
    qwen = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir), local_files_only=True)
    messages, tools = CHATS[index]
    for kwargs in ({}, {"add_generation_prompt": True}, {"add_generation_prompt": True, "enable_thinking": False}):
        msgs = messages if not kwargs else messages[:-1] if messages[-1]["role"] == "assistant" else messages
        a = ours.apply_chat_template(msgs, tools=tools, tokenize=False, **kwargs)
        b = qwen.apply_chat_template(msgs, tools=tools, tokenize=False, **kwargs)
        turns, rest = structure(a)
        assert (turns, rest) == structure(b), kwargs
        prompt = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if kwargs.get("enable_thinking") is False else "")
        assert turns and rest == (prompt if kwargs else ""), kwargs


def test_embedded_template_features(embedded_target):
    tok = load_tokenizer(load_target(embedded_target / "target.json"))
    user = [{"role": "user", "content": "Hi"}]
    on = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    off = tok.apply_chat_template(user, add_generation_prompt=True, enable_thinking=False, tokenize=False)
    assert on == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"

    messages, tools = CHATS[2]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou call tools.\n\n") and json.dumps(WEATHER_TOOL) in system
    assert ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nread both\n</think>\n\nOslo is cold, Lima warm.<|im_end|>\n")

    earlier = tok.apply_chat_template(CHATS[0][0], tokenize=False)
    assert "two and two" not in earlier and "<think>\nthree and three\n</think>\n\n6" in earlier


def test_a_conversation_the_template_cannot_render_is_skipped_and_counted():
    import logging

    from draftline.core.skips import SkipError, Skips
    from draftline.target.embedded.tokenizer import render_corpus

    good = tiny_conversations(3)
    # tool_calls that are not a list: the template raises on this one conversation.
    bad = Conversation(source="tiny", row=99, messages=[
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": 5},
    ])
    skips = Skips(logging.getLogger("test"))
    rendered = list(render_corpus([good[0], bad, *good[1:]], skips))
    assert [c.row for c, _ in rendered] == [c.row for c in good]
    assert skips.as_dict() == {"render_error": 1}
    with pytest.raises(SkipError, match="tiny row 99"):
        list(render_corpus([bad], Skips(logging.getLogger("test"), strict=True)))

