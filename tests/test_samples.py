"""The embedded samples: made by a deterministic script, in the real schemas, with the documented quirks."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
NAMES = ["infinity_instruct", "webinstructsub", "codefeedback", "metamathqa", "hermes_fc", "agent", "http_traces"]
QUIRKS = json.loads((SAMPLES / "quirks.json").read_text())


def lines(name: str) -> list[str]:
    return (SAMPLES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()


def rows(name: str) -> list[dict]:
    """Parsed rows, without the deliberately broken lines."""
    broken = set(QUIRKS[name]["quirks"].get("broken_json", []))
    return [json.loads(line) for i, line in enumerate(lines(name), 1) if i not in broken]


def test_script_is_deterministic_and_made_the_committed_files(tmp_path):
    for out in (tmp_path / "a", tmp_path / "b"):
        subprocess.run([sys.executable, str(SAMPLES / "make_samples.py"), "--out", str(out)], check=True,
                       capture_output=True)
    for f in [f"{n}.jsonl" for n in NAMES] + ["quirks.json"]:
        made = (tmp_path / "a" / f).read_bytes()
        assert made == (tmp_path / "b" / f).read_bytes(), f
        assert made == (SAMPLES / f).read_bytes(), f"{f} differs from what make_samples.py makes: rerun it"


def test_sizes():
    total = 0
    for name in NAMES:
        assert 300 <= len(lines(name)) <= 1000, name
        assert QUIRKS[name]["rows"] == len(lines(name))
        total += (SAMPLES / f"{name}.jsonl").stat().st_size
    assert total < 5_000_000


def test_only_the_documented_lines_are_broken():
    for name in NAMES:
        broken = set(QUIRKS[name]["quirks"].get("broken_json", []))
        for i, line in enumerate(lines(name), 1):
            if i in broken:
                with pytest.raises(json.JSONDecodeError):
                    json.loads(line)
            else:
                assert isinstance(json.loads(line), dict), (name, i)


def squash(v):
    """Whitespace-normalised copy of a JSON value: runs of whitespace in strings become one space, ends stripped."""
    if isinstance(v, str):
        return " ".join(v.split())
    if isinstance(v, list):
        return [squash(x) for x in v]
    if isinstance(v, dict):
        return {k: squash(x) for k, x in v.items()}
    return v


def test_duplicates_are_where_the_manifest_says():
    for name in NAMES:
        ls, q = lines(name), QUIRKS[name]["quirks"]
        assert len(q["exact_duplicate"]) >= 8, name
        for line, of in q["exact_duplicate"]:
            assert ls[line - 1] == ls[of - 1]
        for line, of in q["whitespace_duplicate"]:
            a, b = json.loads(ls[line - 1]), json.loads(ls[of - 1])
            assert a != b and squash(a) == squash(b)
        for line, of in q.get("near_duplicate", []):
            assert ls[line - 1] != ls[of - 1]
            assert len(set(ls[line - 1].split()) ^ set(ls[of - 1].split())) <= 3


def test_metamathqa_variants_differ_only_in_numbers():
    ls, q = lines("metamathqa"), QUIRKS["metamathqa"]["quirks"]["numbers_only_variant"]
    assert len(q) >= 10
    def digits(s: str) -> str:
        return re.sub(r"\d+", "#", s)

    for line, of in q:
        a, b = json.loads(ls[line - 1]), json.loads(ls[of - 1])
        assert a["type"] in ("GSM_SV", "GSM_FOBAR") and a["query"] != b["query"]
        assert digits(a["query"]) == digits(b["query"]) and digits(a["response"]) == digits(b["response"])
    assert Counter(r["type"] for r in rows("metamathqa")).keys() >= {
        "GSM_AnsAug", "GSM_Rephrased", "GSM_SV", "GSM_FOBAR", "MATH_AnsAug", "MATH_Rephrased"}
    assert all(r["response"].rsplit("\n", 1)[-1].startswith("The answer is: ") for r in rows("metamathqa"))


def test_real_field_names(datasets_dir):
    def keys(fixture):
        return {k for line in (datasets_dir / f"{fixture}.jsonl").read_text().splitlines() for k in json.loads(line)}

    assert {k for r in rows("infinity_instruct") for k in r} == keys("infinity_instruct_7M")
    assert {k for r in rows("metamathqa") for k in r} == keys("metamathqa")
    assert {k for r in rows("codefeedback") for k in r} == keys("codefeedback_filtered_instruction")
    assert {k for r in rows("webinstructsub") for k in r} == {"question", "answer", "source"}
    assert {k for r in rows("hermes_fc") for k in r} == {"id", "conversations", "category", "subcategory", "task"}
    agent = rows("agent")
    assert {k for r in agent if "conversations" in r for k in r} == keys("agent_glaive_toolcall_sharegpt")
    assert {k for r in agent if "messages" in r for k in r} == keys("agent_reason_tool_use_llamafactory_v1")
    assert {k for r in rows("http_traces") for k in r} == {"id", "endpoint", "body", "body_raw", "parse_error"}


def test_source_specific_shapes():
    ii = rows("infinity_instruct")
    assert sum(r["langdetect"] == "zh-cn" for r in ii) >= 10
    assert any(len(r["conversations"]) > 3 for r in ii) and any(r["conversations"] and r["conversations"][0]["from"] == "system" for r in ii)
    assert {r["source"] for r in rows("webinstructsub")} == {"socratic", "mathstackexchange", "stackexchange"}

    # Hermes: tools as a Python-repr list in the system prompt, single-quoted tool calls; one long shared prompt.
    hermes = rows("hermes_fc")
    bad = {i for k in ("bad_tools_repr", "no_tools_tag") for i in QUIRKS["hermes_fc"]["quirks"][k]}
    for i, r in enumerate(hermes, 1):
        system = r["conversations"][0]["value"]
        m = re.search(r"<tools>\n(.*)\n</tools>", system, re.S)
        if i in bad:
            assert m is None or pytest.raises(SyntaxError, ast.literal_eval, m.group(1))
        else:
            assert isinstance(ast.literal_eval(m.group(1)), list)
    shared, count = Counter(r["conversations"][0]["value"] for r in hermes).most_common(1)[0]
    assert count >= 150 and 2500 <= len(shared) <= 4000
    assert len({r["conversations"][1]["value"] for r in hermes if r["conversations"][0]["value"] == shared}) >= 100
    assert any(m["value"].startswith("<tool_call>\n{'arguments'") for r in hermes for m in r["conversations"])

    agent = rows("agent")
    roles = {m["from"] for r in agent if "conversations" in r for m in r["conversations"]}
    assert roles == {"human", "gpt", "function_call", "observation"}
    parts = {p["type"] for r in agent if "messages" in r for m in r["messages"] for p in m["content"]}
    assert parts == {"text", "reasoning", "tool_call"}
    assert Counter(r["tools"] for r in agent).most_common(1)[0][1] >= 100

    bodies = [r["body"] for r in rows("http_traces") if r["body"] is not None]
    contents = [m["content"] for b in bodies for m in b.get("messages", [])]
    assert any(isinstance(c, str) for c in contents) and any(isinstance(c, list) for c in contents)
    image_urls = [p["image_url"]["url"] for c in contents if isinstance(c, list) for p in c if p["type"] == "image_url"]
    assert any(u.startswith("data:image/png;base64,") for u in image_urls) and any(u.startswith("https://") for u in image_urls)


def answers(name: str) -> list[str]:
    out = []
    for r in rows(name):
        if name in ("infinity_instruct", "hermes_fc"):
            out += [m["value"] for m in r["conversations"] if m["from"] == "gpt" and not m["value"].startswith("<tool_call>")]
        elif name == "agent":
            out += [m["value"] for m in r.get("conversations", []) if m["from"] == "gpt"]
            out += [p["value"] for m in r.get("messages", []) if m["role"] == "assistant" for p in m["content"] if p["type"] == "text"]
        else:
            out.append(r.get("answer") or r.get("response") or "")
    return [a for a in out if a]


@pytest.mark.parametrize("name", [n for n in NAMES if n != "http_traces"])
def test_answers_are_short_and_patterned(name):
    got = answers(name)
    lengths = sorted(len(a.split()) for a in got)
    assert lengths[len(lengths) // 2] <= 120 and lengths[int(len(lengths) * 0.95)] <= 130, name
    # Patterned: answers share their skeleton, so the distinct answers with digits masked are far fewer than answers.
    skeletons = {re.sub(r"\d+", "#", a) for a in got}
    assert len(skeletons) < len(got), name
