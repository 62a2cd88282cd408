"""The tokenize stage with the real Qwen3 tokenizer and templates: the loss mask covers exactly what the target
generated, input_ids equal whole-text tokenization, bad rows are counted skips, output is deterministic."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import transformers
from conftest import default_params

from draftline.core import dataset as dataset_format
from draftline.core.errors import MissingInput
from draftline.core.files import DiskFullError
from draftline.core.fingerprint import template_sha256, tokenizer_fingerprint
from draftline.core.jsonl import dumps
from draftline.core.records import TargetInfo
from draftline.core.runner import StageRun, execute, main, run_file
from draftline.core.skips import SkipError
from draftline.tokenize.loss_mask import Example, MaskBuilder
from draftline.tokenize.params import TokenizeParams
from draftline.tokenize.stage import TokenizeArgs, run_tokenize


def tokenize_params(**overrides) -> TokenizeParams:
    return TokenizeParams.parse(default_params("tokenize", **overrides), "tokenize")


EOT = "<|im_end|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL_OBJ = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def load(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    return load(qwen3_tokenizer_dir)


def build(tok, examples: list[Example], max_len: int = 4096, overflow: str = "drop"):
    eot = tok.convert_tokens_to_ids(EOT)
    res = MaskBuilder(tok, eot, max_len, overflow)(examples)
    return res, res.table.to_pylist()


def masked_and_rest(tok, row) -> tuple[str, str]:
    ids, mask = np.array(row["input_ids"]), np.array(row["loss_mask"])
    return tok.decode(ids[mask]), tok.decode(ids[~mask])


def ex(messages, tools=None, thinking=None, id="x") -> Example:
    last = max(i for i, m in enumerate(messages) if m["role"] != "assistant")
    return Example(id, "src", messages[: last + 1], messages, tools, thinking)


USER = {"role": "user", "content": "What is 2 + 3?"}
# (name, messages, tools, enable_thinking, the exact text the target generated)
CASES = [
    (
        "thinking_on",
        [USER, {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 plus 3 is 5."}],
        None,
        True,
        "<think>\n2 plus 3 is 5.\n</think>\n\nIt is 5." + EOT,
    ),
    ("thinking_off", [USER, {"role": "assistant", "content": "It is 5."}], None, False, "It is 5." + EOT),
    (
        "tool_call",
        [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}],
        TOOLS,
        False,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' + EOT,
    ),
    (
        "tool_response_multiturn_reasoning",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "It is 21 C.", "reasoning_content": "Got 21."},
        ],
        TOOLS,
        True,
        "<think>\nGot 21.\n</think>\n\nIt is 21 C." + EOT,
    ),
]


@pytest.mark.parametrize("name,messages,tools,thinking,generated", CASES, ids=[c[0] for c in CASES])
def test_mask_is_exactly_what_the_target_generated(qwen3, name, messages, tools, thinking, generated):
    e = ex(messages, tools, thinking)
    res, rows = build(qwen3, [e])
    assert not res.skips and len(rows) == 1
    row = rows[0]
    masked, rest = masked_and_rest(qwen3, row)
    assert masked == generated
    # Everything else is the prompt as the server renders it (the empty think block included when thinking is
    # off), plus the newline the template puts after the end-of-turn token.
    kw = {} if thinking is None else {"enable_thinking": thinking}
    prompt = qwen3.apply_chat_template(e.prompt, tools=tools, tokenize=False, add_generation_prompt=True, **kw)
    assert rest == prompt + "\n"
    if thinking is False:
        assert prompt.endswith("<think>\n\n</think>\n\n")
    # No drift: the ids are transformers' own tokenization of the whole conversation.
    whole = qwen3.apply_chat_template(e.full, tools=tools, tokenize=True, return_dict=True, **kw)["input_ids"]
    assert row["input_ids"] == list(whole)
    mask = np.array(row["loss_mask"])
    run = np.flatnonzero(mask)
    assert run[-1] - run[0] + 1 == len(run) == row["num_loss_tokens"]  # one contiguous run
    assert row["input_ids"][run[-1]] == qwen3.convert_tokens_to_ids(EOT)
    assert row["num_tokens"] == len(row["input_ids"])


def test_alt_thinking_only_template_keeps_the_opening_think_unmasked(qwen3_alt_tokenizer_dir):
    tok = load(qwen3_alt_tokenizer_dir("qwen3_30b_thinking_0527"))
    e = ex([USER, {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 plus 3 is 5."}])
    res, rows = build(tok, [e])
    masked, rest = masked_and_rest(tok, rows[0])
    assert masked == "2 plus 3 is 5.\n</think>\n\nIt is 5." + EOT
    assert rest.endswith("<|im_start|>assistant\n<think>\n\n")
    assert rows[0]["input_ids"] == list(tok.apply_chat_template(e.full, tokenize=True, return_dict=True)["input_ids"])


def test_alt_coder_template_xml_tool_call(qwen3_alt_tokenizer_dir):
    tok = load(qwen3_alt_tokenizer_dir("qwen3_coder"))
    # The reply's arguments arrive as a JSON string (OpenAI format); this template iterates over them as an object.
    e = ex([{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}], TOOLS)
    res, rows = build(tok, [e])
    masked, _ = masked_and_rest(tok, rows[0])
    expected = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    assert masked == expected + EOT
    as_object = [e.full[0], {**e.full[1], "tool_calls": [CALL_OBJ]}]
    whole = tok.apply_chat_template(as_object, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert rows[0]["input_ids"] == list(whole)


def test_tool_call_arguments_as_string_or_object_render_alike(qwen3):
    msgs = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    obj = [msgs[0], {**msgs[1], "tool_calls": [CALL_OBJ]}]
    _, rows = build(qwen3, [ex(msgs, TOOLS, False), ex(obj, TOOLS, False)])
    assert rows[0]["input_ids"] == rows[1]["input_ids"] and rows[0]["loss_mask"] == rows[1]["loss_mask"]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the input is left alone


def test_row_checks_are_counted_skips(qwen3):
    reply = {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 plus 3 is 5."}
    examples = [
        # Thinking off, yet the reply has reasoning: the full render does not start with the prompt render.
        ex([USER, reply], thinking=False, id="not_prefix"),
        ex([USER, {"role": "assistant", "content": ""}], thinking=False, id="one_token"),
        ex([USER, {"role": "assistant", "content": "word " * 200}], thinking=False, id="long"),
        ex([USER, reply], thinking=True, id="good"),
    ]
    res, rows = build(qwen3, examples, max_len=100)
    assert [r["id"] for r in rows] == ["good"]
    assert sorted((r, i) for r, i, _ in res.skips) == [
        ("template_not_prefix", "not_prefix"),
        ("too_few_loss_tokens", "one_token"),
        ("too_long", "long"),
    ]
    # truncate keeps the long row, cut to max_len, its reply partly supervised
    res, rows = build(qwen3, examples[2:3], max_len=100, overflow="truncate")
    assert res.truncated == 1 and not res.skips
    assert rows[0]["num_tokens"] == 100 and 0 < rows[0]["num_loss_tokens"] < 100
    assert not rows[0]["loss_mask"][0]
    # truncated inside the prompt: nothing left to supervise
    res, rows = build(qwen3, examples[2:3], max_len=5, overflow="truncate")
    assert rows == [] and [s[0] for s in res.skips] == ["empty_loss_mask"]


def custom_template_tokenizer(qwen3_tokenizer_dir: Path, tmp_path: Path, template: str):
    """The Qwen3 vocabulary with a deliberately broken chat template."""
    cfg = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    for f in ("vocab.json", "merges.txt"):
        os.symlink(qwen3_tokenizer_dir / f, tmp_path / f)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return load(tmp_path)


@pytest.mark.parametrize(
    "reply_end,generation_prompt,reason",
    [
        ("", "<|im_start|>assistant\n", "no_end_of_turn"),
        ("<|im_end|>\nEXTRA", "<|im_start|>assistant\n", "text_after_end_of_turn"),
        # The prompt ends inside a word of the reply: the token "Hello" would be half prompt, half reply.
        ("<|im_end|>\n", "<|im_start|>assistant\nHel", "boundary_inside_token"),
    ],
)
def test_templates_without_a_clean_seam_or_end_are_skipped(qwen3_tokenizer_dir, tmp_path, reply_end, generation_prompt, reason):
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.role != 'assistant' %}<|im_end|>\n{% else %}" + reply_end + "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}" + generation_prompt + "{% endif %}"
    )
    tok = custom_template_tokenizer(qwen3_tokenizer_dir, tmp_path, template)
    res, rows = build(tok, [ex([USER, {"role": "assistant", "content": "Hello world."}])])
    assert rows == [] and [s[0] for s in res.skips] == [reason]


# ---- the whole stage ------------------------------------------------------------------------------------------


def target_dir(tok_dir: Path, tmp: Path) -> Path:
    """A target.json describing a tokenizer-only target (as the target stage does for a real checkpoint)."""
    tok = load(tok_dir)
    info = TargetInfo(
        path=str(tok_dir),
        tokenizer_fingerprint=tokenizer_fingerprint(tok_dir, tok.chat_template),
        chat_template_sha256=template_sha256(tok.chat_template),
        eos_token=EOT,
        eos_token_id=tok.convert_tokens_to_ids(EOT),
        pad_token_id=tok.pad_token_id,
        end_of_turn_token=EOT,
        end_of_turn_token_id=tok.convert_tokens_to_ids(EOT),
        think_start_token="<think>",
        think_end_token="</think>",
        mask_token_id=len(tok),
        vocab_size=len(tok),
    )
    (tmp / "target").mkdir()
    (tmp / "target" / "target.json").write_text(json.dumps(info.to_dict()))
    return tmp / "target" / "target.json"


def completion(i: int, messages, tools=None, finish="stop") -> dict:
    return {
        "id": f"p{i:03d}",
        "source": ["math", "chat", "tools"][i % 3],
        "row": i,
        "messages": messages,
        "tools": tools,
        "finish_reason": finish,
        "generation": {"enable_thinking": True},
    }


def write_completions(folder: Path, n: int = 36) -> None:
    folder.mkdir(parents=True)
    lines = []
    for i in range(n):
        msgs = [
            {"role": "user", "content": f"What is {i} + {i}? " + "Explain. " * (i % 7)},
            {"role": "assistant", "content": f"It is {2 * i}.", "reasoning_content": f"{i} + {i} = {2 * i}. " * (1 + i % 5)},
        ]
        lines.append(dumps(completion(i, msgs, TOOLS if i % 3 == 2 else None)))
    lines += [
        "{broken",
        dumps(completion(900, [{"role": "user", "content": "Hi"}])),  # no reply
        dumps(completion(901, [USER, {"role": "assistant", "content": "It", "reasoning_content": "cut"}], finish="length")),
    ]
    half = len(lines) // 2
    (folder / "part-00000.jsonl").write_text("\n".join(lines[:half]) + "\n")
    (folder / "part-00001.jsonl").write_text("\n".join(lines[half:]) + "\n")


# write_completions' three bad lines, one per reason, are 2.6% of its 39: more than the default share allows.
FIXTURE_SHARE = 0.05


def stage_args(comp: Path, target: Path, out: Path, reports: Path) -> TokenizeArgs:
    return TokenizeArgs(completions=comp, target=target, out=out, metrics=reports / "m.json",
                        report=reports / "report.json", plot=reports / "seq_len.csv")


def run(tmp: Path, comp: Path, target: Path, name: str, **params) -> tuple[Path, StageRun]:
    params.setdefault("max_skip_share", FIXTURE_SHARE)
    out = tmp / name
    args = stage_args(comp, target, out / "tokenized", out)
    return out, execute("tokenize", run_tokenize, tokenize_params(**params), args)


def folder_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_stage_end_to_end_deterministic_and_worker_independent(qwen3_tokenizer_dir, tmp_path):
    comp = tmp_path / "completions"
    write_completions(comp)
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    out1, s1 = run(tmp_path, comp, target, "w1", workers=1, chunk_rows=5, max_len=512)
    out1b, _ = run(tmp_path, comp, target, "w1b", workers=1, chunk_rows=5, max_len=512)
    out2, s2 = run(tmp_path, comp, target, "w2", workers=2, chunk_rows=5, max_len=512)
    files = folder_bytes(out1 / "tokenized")
    assert files == folder_bytes(out1b / "tokenized") == folder_bytes(out2 / "tokenized")
    # Metrics, report and plot are the same bytes whatever the run and the workers; times and speeds are apart.
    for name in ("m.json", "report.json", "seq_len.csv"):
        assert (out1 / name).read_bytes() == (out1b / name).read_bytes() == (out2 / name).read_bytes()
    for out in (out1, out2):
        assert set(json.loads(run_file(out / "report.json").read_text())) == {"stage_seconds", "tokens_per_second"}
    assert s1.run["stage_seconds"] > 0 and s1.run["tokens_per_second"] > 0

    m1 = json.loads((out1 / "m.json").read_text())
    d1 = json.loads((out1 / "report.json").read_text())
    assert m1 == {"rows": 36, "tokens": d1["total_tokens"], "loss_tokens": d1["loss_tokens"], "truncated": 0,
                  "skipped": 3}
    assert m1 == {**s1.headline, "skipped": 3} and d1 == {**s1.details, "skips": d1["skips"]}
    assert d1["samples"] == 36
    assert d1["skips"] == {"finish_length": 1, "invalid_json": 1, "no_assistant_reply": 1}
    assert sum(s["samples"] for s in d1["per_source"].values()) == 36
    assert d1["loss_tokens"] == sum(s["loss_tokens"] for s in d1["per_source"].values())
    with open(out1 / "seq_len.csv") as f:
        assert sum(int(r["rows"]) for r in csv.DictReader(f)) == 36

    ds = dataset_format.load(out1 / "tokenized")
    assert ds.cache_files and len(ds) == 36  # memory-mapped from the shard files
    lengths = np.array(ds["num_tokens"])
    assert d1["len_max"] == lengths.max() and d1["len_median"] == np.median(lengths)
    assert d1["total_tokens"] == lengths.sum() and d1["loss_tokens"] == sum(ds["num_loss_tokens"])
    assert ds[0]["id"] == "p000" and ds[35]["id"] == "p035"  # input order kept
    meta = dataset_format.read_meta(out1 / "tokenized")
    assert meta.enable_thinking is True and meta.max_len == 512 and meta.num_rows == 36
    assert meta.num_tokens == m1["tokens"] and meta.mask_token_id > meta.end_of_turn_token_id


def test_a_full_disk_fails_naming_the_output_leaves_nothing_then_the_rerun_gives_the_same_bytes(
    qwen3_tokenizer_dir, tmp_path, small_disk
):
    comp = tmp_path / "completions"
    write_completions(comp)
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    ref, _ = run(tmp_path, comp, target, "ref", max_len=512)
    disk = small_disk(4096)  # one page: the shards and their index do not fit
    out = disk.path / "tokenized"

    def tokenize():
        params = tokenize_params(max_len=512, max_skip_share=FIXTURE_SHARE)
        return execute("tokenize", run_tokenize, params, stage_args(comp, target, out, tmp_path / "reports"))

    with pytest.raises(DiskFullError, match=r"tokenized"):
        tokenize()
    assert not out.exists() and disk.leftovers() == []
    disk.grow(1 << 20)
    tokenize()
    assert folder_bytes(out) == folder_bytes(ref / "tokenized")


def test_one_reason_over_the_share_stops_the_stage_naming_it_and_writes_nothing(qwen3_tokenizer_dir, tmp_path):
    comp = tmp_path / "completions"
    write_completions(comp)
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    with pytest.raises(SkipError, match=r"of 39 rows .* for 'too_long', more than tokenize.max_skip_share \(0.05\) "
                                        r"allows: raise tokenize.max_len \(40"):
        run(tmp_path, comp, target, "short", max_len=40)
    assert not (tmp_path / "short" / "tokenized").exists()
    _, stage = run(tmp_path, comp, target, "ok", max_len=40, max_skip_share=1.0)  # the loss accepted: counted, written
    assert stage.skips.counts["too_long"] > 2
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["skips"]["too_long"] > 2


def test_turns_all_one_row_per_assistant_turn(qwen3_tokenizer_dir, tmp_path):
    comp = tmp_path / "completions"
    comp.mkdir()
    msgs = [
        {"role": "user", "content": "Pick a number."},
        {"role": "assistant", "content": "Seven.", "reasoning_content": "Any will do."},
        {"role": "user", "content": "Double it."},
        {"role": "assistant", "content": "Fourteen.", "reasoning_content": "7 * 2 = 14."},
    ]
    (comp / "part-00000.jsonl").write_text(dumps(completion(0, msgs)) + "\n")
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    tok = load(qwen3_tokenizer_dir)
    out, _ = run(tmp_path, comp, target, "all", workers=1, turns="all")
    rows = dataset_format.load(out / "tokenized").to_list()
    assert [r["id"] for r in rows] == ["p000/turn0", "p000/turn1"]
    assert masked_and_rest(tok, rows[0])[0] == "<think>\nAny will do.\n</think>\n\nSeven." + EOT
    masked, rest = masked_and_rest(tok, rows[1])
    assert masked == "<think>\n7 * 2 = 14.\n</think>\n\nFourteen." + EOT
    assert "Any will do." not in rest  # Qwen3 drops the earlier turn's reasoning from the history
    out, _ = run(tmp_path, comp, target, "last", workers=1, turns="last")
    assert [r["id"] for r in dataset_format.load(out / "tokenized").to_list()] == ["p000"]


def test_embedded_target(request):
    """The same properties with the pipeline's own embedded target (when the target stage provides it)."""
    try:
        folder = request.getfixturevalue("embedded_target")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py has no embedded_target fixture")
    from draftline.core.target_loader import load_target, load_tokenizer

    info = load_target(folder / "target.json")
    tok = load_tokenizer(info)
    reply = {"role": "assistant", "content": "The answer is 5.", "reasoning_content": "Two plus three."}
    res = MaskBuilder(tok, info.end_of_turn_token_id, 4096, "drop")([ex([USER, reply], thinking=True)])
    assert not res.skips
    row = res.table.to_pylist()[0]
    masked, _ = masked_and_rest(tok, row)
    assert masked == f"{info.think_start_token}\nTwo plus three.\n{info.think_end_token}\n\nThe answer is 5.{info.end_of_turn_token}"
    assert row["input_ids"][np.flatnonzero(row["loss_mask"])[-1]] == info.end_of_turn_token_id
    whole = tok.apply_chat_template([USER, reply], tokenize=True, return_dict=True, enable_thinking=True)["input_ids"]
    assert row["input_ids"] == list(whole)


def test_strict_stops_at_the_first_bad_line_and_writes_nothing(qwen3_tokenizer_dir, tmp_path):
    from draftline.core.skips import SkipError

    comp = tmp_path / "completions"
    write_completions(comp, n=3)
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    with pytest.raises(SkipError, match="part-00001.jsonl:1: invalid_json"):
        run(tmp_path, comp, target, "strict", workers=1, strict=True)
    assert not (tmp_path / "strict" / "tokenized").exists()


def test_missing_completions_are_refused_in_one_line_without_a_traceback(qwen3_tokenizer_dir, tmp_path, capsys):
    target = target_dir(qwen3_tokenizer_dir, tmp_path)
    empty = tmp_path / "completions"
    empty.mkdir()
    args = stage_args(empty, target, tmp_path / "tokenized", tmp_path / "reports")
    with pytest.raises(MissingInput, match="run the generate stage first"):
        execute("tokenize", run_tokenize, tokenize_params(), args)
    argv = [f"--{k}={v}" for k, v in vars(args).items()]
    with pytest.raises(SystemExit) as exit_:
        main("tokenize", TokenizeArgs, lambda _args: tokenize_params(), run_tokenize, argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "part-*.jsonl" in line] == [
        f"tokenize: no part-*.jsonl in {empty}: run the generate stage first (dvc repro generate)"
    ]
    assert not (tmp_path / "tokenized").exists() and not (tmp_path / "reports").exists()


def test_histogram_bins_cover_zero_to_max_len():
    from draftline.tokenize.stage import HISTOGRAM_BINS, histogram

    rows = histogram(np.array([0, 47, 48, 3071, 3072]), 3072)
    assert len(rows) == HISTOGRAM_BINS and rows[1]["seq_len"] == 48
    assert [r["rows"] for r in rows if r["rows"]] == [2, 1, 2]


def test_params_are_validated():
    with pytest.raises(ValueError, match="unknown key"):
        tokenize_params(max_length=10)
    with pytest.raises(ValueError, match="overflow"):
        tokenize_params(overflow="wrap")
    assert tokenize_params(workers=0).num_workers == os.cpu_count()
