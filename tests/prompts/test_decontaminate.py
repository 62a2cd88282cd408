"""Decontamination (prompts/decontaminate.py): the index on small strings, the check against held-out prompts, and
the whole prompt stage on a source planted with copies of evaluation prompts (verbatim, whitespace, case, a
changed number, swapped sentences, wrapped in an instruction) beside unrelated prompts."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import pytest
from conftest import default_params

from draftline.core.contamination import EvalIndex, EvalPrompt, extra_prompts, shingle
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE, Conversation, PromptRecord
from draftline.core.runner import execute
from draftline.core.skips import Skips
from draftline.prompts.canonical import prompt_id
from draftline.prompts.decontaminate import decontaminate
from draftline.prompts.params import (
    BlendParams,
    DecontaminateParams,
    DedupParams,
    PromptsParams,
    PromptsSettings,
)
from draftline.prompts.stage import PromptsArgs, run_prompts
from draftline.target.params import TargetParams
from draftline.target.stage import write_target

PARAMS = DecontaminateParams.parse(default_params("decontaminate"), "decontaminate")

# Long enough for n-grams (two sentences of more than 8 words), as a benchmark question is.
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?")
OTHER = ("A robe takes 2 bolts of blue fiber and half that much white fiber for the whole garment. "
         "How many bolts in total does it take to make one robe?")
SHORT = "Name three primary colours."


def _swap(text: str) -> str:
    first, second = text.split(". ", 1)
    return f"{second} {first}."


EDITS = {
    "verbatim": lambda t: t,
    "whitespace": lambda t: "  " + t.replace(" ", "   \t", 4).replace(". ", ".\n\n") + "\n",
    "case": lambda t: t.upper(),
    "number": lambda t: t.replace("48", "52").replace("2 bolts", "3 bolts"),
    "swapped": _swap,
    "wrapped": lambda t: f"Answer the question below, showing your work.\n\n{t}\n\nBe concise.",
}


def _index(*texts: str, ngram: int = PARAMS.ngram, shared_by: int = PARAMS.shared_by) -> EvalIndex:
    return EvalIndex.build([EvalPrompt("bench", f"row {i}", t) for i, t in enumerate(texts)], ngram, shared_by)


# ------------------------------------------------------------------------------------------------- the index


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_copy_hits_its_evaluation_prompt_only(edit: str) -> None:
    index = _index(QUESTION, OTHER)
    (hit,) = index.hits([EDITS[edit](QUESTION)], PARAMS.threshold)
    assert set(hit) == {0} and hit[0] == 1.0


def test_unrelated_prompts_and_fragments_do_not_hit() -> None:
    index = _index(QUESTION, OTHER)
    texts = ["How many clips did you sell?",  # a fragment: gives away nothing
             "Natalia sold clips to 48 of her friends in April.",  # 3 of its 17 n-grams
             "Write a haiku about the sea in April, with clips of foam and friends on the shore."]
    assert index.hits(texts, PARAMS.threshold) == [{}, {}, {}]
    assert index.hits(texts[1:2], 0.1) == [{0: 0.1765}]  # a hit only at a threshold as low as 3/17


def test_sentences_shorter_than_n_are_one_ngram_and_never_cross_a_sentence_end() -> None:
    sh = shingle(["one two three. four five six seven eight nine ten eleven", ""], 8)
    assert sh.words.tolist() == [11, 0]
    assert len(sh.hashes) == 1 + 1  # "one two three" whole; "four .. eleven" is exactly 8 words: one window
    assert set(shingle(["four five six seven eight nine ten eleven! One two three"], 8).hashes) == set(sh.hashes)


def test_a_short_evaluation_prompt_matches_by_its_whole_text_only() -> None:
    index = _index(SHORT)
    assert index.sizes.tolist() == [0]
    texts = [SHORT, "  name THREE primary colours!", "Name three primary colours. Then mix them.",
             "Name 3 primary colours."]
    assert index.hits(texts, PARAMS.threshold) == [{0: 1.0}, {0: 1.0}, {}, {}]


def test_boilerplate_shared_by_many_evaluation_prompts_counts_for_none() -> None:
    suffix = " Please reason step by step, and put your final answer within \\boxed{}."
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnop", k=6)) for _ in range(400)]  # digits would all read as 0
    questions = [" ".join(rng.choices(words, k=14)) + "." + suffix for _ in range(PARAMS.shared_by)]
    index = _index(*questions)
    assert all(size == 7 for size in index.sizes)  # 14 words: 7 windows; the suffix's 5 dropped
    assert index.hits(["Solve this." + suffix], PARAMS.threshold) == [{}]
    assert index.hits([questions[3]], PARAMS.threshold) == [{3: 1.0}]


def test_hits_do_not_depend_on_the_batch() -> None:
    index = _index(QUESTION, OTHER, SHORT)
    texts = [EDITS[e](t) for e in sorted(EDITS) for t in (QUESTION, OTHER)] + [SHORT, "unrelated words here"] * 3
    whole = index.hits(texts, PARAMS.threshold)
    assert whole == [h for t in texts for h in index.hits([t], PARAMS.threshold)]
    assert whole == index.hits(texts, PARAMS.threshold, batch=3)


# --------------------------------------------------------------------------------------- held-out prompts


def _record(source: str, row: int, text: str) -> PromptRecord:
    messages = [{"role": "user", "content": text}]
    return PromptRecord(prompt_id(messages, None), source, row, messages)


def test_a_training_prompt_giving_away_a_held_out_prompt_is_dropped_not_the_held_out_one() -> None:
    held, copy, clean = _record("a", 0, QUESTION), _record("b", 1, EDITS["wrapped"](QUESTION)), _record("b", 2, OTHER)
    bench = _record("a", 3, "What is the capital of the country whose flag shows a red maple leaf on white?")
    outside = [EvalPrompt("quiz", "row 0", bench.messages[0]["content"])]
    dropped, c = decontaminate([held, copy, clean, bench], {held.id, bench.id}, outside, PARAMS,
                               Skips(logging.getLogger("test")))
    # The held-out prompt that is a benchmark's own is dropped too (counted under the benchmark), never replaced.
    assert dropped == {copy.id, bench.id}
    assert dict(c.by_set) == {"heldout": 1, "quiz": 1} and dict(c.by_source) == {"a": 1, "b": 1}
    assert c.headline() == {"total": 2, "quiz": 1, "heldout": 1}
    assert c.examples["heldout"][0]["eval"] == "a row 0"


# ------------------------------------------------------------------------------------------- the whole stage

SENTENCE_WORDS = ("river lantern copper meadow violin harbor puzzle orchard glacier falcon pepper tunnel basket "
                  "canyon thistle marble saddle comet walnut ferry quartz ribbon ember willow").split()


def _unrelated(rng: random.Random) -> str:
    """Two sentences of random words from a small vocabulary mixed with unique ones: related to nothing."""
    words = lambda k: " ".join(rng.choice(SENTENCE_WORDS) + "".join(rng.choices("xyzqkv", k=4)) for _ in range(k))  # noqa: E731
    return f"Describe {words(9)}. Then compare {words(7)}?"


def _write_conversations(folder: Path, source: str, texts: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CONVERSATIONS_FILE, "w", encoding="utf-8") as f:
        for row, text in enumerate(texts):
            f.write(Conversation(source=source, row=row, messages=[
                {"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]).to_json() + "\n")
    (folder / CONVERSATIONS_STATS_FILE).write_text(
        json.dumps({"rows_read": len(texts), "skipped": {}, "media_parts_dropped": 0}), encoding="utf-8")


# Benchmark questions, one per planted edit (each copy distinct, so that dedup cannot take it before the check).
QUESTIONS = [
    "A bakery sells 14 loaves of rye bread every morning and twice as many white loaves in the afternoon. How many "
    "loaves does the bakery sell in a week if it opens every day?",
    "Tom walks 3 kilometres to school each day and takes the bus back home in the evening. How far does Tom walk "
    "to school during a term of 60 school days?",
    "Write a short essay that explains why the sky looks blue during the day but red and orange at sunset. Use an "
    "example that a child of ten years could follow easily.",
    "A garden has 12 rows of tomato plants with 8 plants in each row, and every plant gives 5 tomatoes. How many "
    "tomatoes does the whole garden give when all plants are ripe?",
    "Draft a polite email to a landlord asking for the broken heater in the flat to be repaired soon. Mention that "
    "the problem started last Tuesday and that it is getting colder.",
    "Explain the difference between a list and a tuple in Python with a small code example. Say when you would "
    "choose one over the other in a real program.",
    "The museum opens at 9 and closes at 17 on weekdays, and two hours later on Saturdays. How many hours is the "
    "museum open in a whole week when it is closed on Sundays?",
]
PLANTS = [("verbatim", 0), ("whitespace", 1), ("case", 2), ("number", 3), ("swapped", 4), ("wrapped", 5),
          ("number", 6)]


def _plant(edit: str, text: str) -> str:
    if edit == "number":
        return re.sub(r"\d+", lambda m: str(int(m.group()) + 1), text, count=1)
    return EDITS[edit](text)


@pytest.fixture(scope="module")
def planted(qwen3_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("decontaminate")
    write_target(TargetParams.parse(default_params("target", path=str(qwen3_tokenizer_dir)), "target"), root / "target")
    rng = random.Random(7)
    # The benchmark set (its last row multi-turn: every user turn is checked), and an extra file with one question.
    sets = root / "sets"
    _write_conversations(sets / "bench", "bench", QUESTIONS[:5])
    with open(sets / "bench" / CONVERSATIONS_FILE, "a", encoding="utf-8") as f:
        f.write(Conversation(source="bench", row=5, messages=[
            {"role": "user", "content": "Tell me a story about a cat."}, {"role": "assistant", "content": "..."},
            {"role": "user", "content": QUESTIONS[5]}]).to_json() + "\n")
    (sets / "extra.jsonl").write_text(json.dumps({"question": QUESTIONS[6]}) + "\n", encoding="utf-8")
    contaminated = [_plant(edit, QUESTIONS[q]) for edit, q in PLANTS]
    unrelated = [_unrelated(rng) for _ in range(40)]
    _write_conversations(root / "conversations" / "mixed", "mixed", unrelated[:20] + contaminated + unrelated[20:])
    _write_conversations(root / "conversations" / "clean", "clean", [_unrelated(rng) for _ in range(20)])
    return {"root": root, "contaminated": contaminated, "unrelated": unrelated}


def _run(planted: dict, out: str, decontaminate: dict | None = None, total: int = 60) -> tuple[dict, dict, list[dict]]:
    root = planted["root"]
    d = DecontaminateParams.parse({**default_params("decontaminate"), "extra": [str(root / "sets" / "extra.jsonl")],
                                   **(decontaminate or {})}, "decontaminate")
    settings = PromptsSettings(
        ["mixed", "clean"], PromptsParams.parse(default_params("prompts"), "prompts"),
        DedupParams.parse({"priority": [], "near": default_params("dedup")["near"] | {"exact_numbers": []}}, "dedup"),
        # Both sources whole and nothing held out: every prompt the check keeps is in train.jsonl.
        BlendParams.parse({**default_params("blend"), "total": total, "eval": {"dev": 0, "test": 0},
                           "sources": {"mixed": {"whole": True}, "clean": {"whole": True}}}, "blend"),
        False, None, d, ["bench"])
    o = root / out
    (root / "drafters").mkdir(exist_ok=True)
    (root / "bases").mkdir(exist_ok=True)
    execute("prompts", run_prompts, settings, PromptsArgs(
        conversations=root / "conversations", target=root / "target" / "target.json", out=o / "prompts",
        metrics=o / "metrics.json", report=o / "report.json", plot=o / "mix.csv", plot_shares=o / "shares.csv",
        plot_languages=o / "languages.csv", drafters=root / "drafters", bases=root / "bases", sets=root / "sets"))
    rows = [json.loads(line) for f in ("train.jsonl", "eval.jsonl")
            for line in (o / "prompts" / f).read_text(encoding="utf-8").splitlines()]
    return (json.loads((o / "metrics.json").read_text()), json.loads((o / "report.json").read_text()), rows)


def test_planted_copies_are_dropped_and_counted_and_unrelated_prompts_kept(planted: dict) -> None:
    metrics, report, rows = _run(planted, "run1")
    texts = {r["messages"][-1]["content"] for r in rows}
    assert not texts & set(planted["contaminated"])
    assert set(planted["unrelated"]) <= texts and len(rows) == 60  # every unrelated prompt kept
    extra = "extra"  # an extra file's set: its name
    assert metrics["contaminated"] == {"total": 7, "bench": 6, extra: 1, "heldout": 0}
    assert report["skips"]["contaminated"] == 7 and metrics["skipped"] == 7
    assert report["sources"]["mixed"]["skipped"] == {"contaminated": 7}
    assert report["sources"]["clean"]["skipped"] == {}
    d = report["decontamination"]
    assert d["eval_prompts"] == {"bench": 7, extra: 1, "heldout": 0} and d["by_source"] == {"mixed": 7}
    assert len(d["examples"]["bench"]) == 3 and all(e["coverage"] == 1.0 for e in d["examples"]["bench"])


def test_the_stage_output_is_byte_identical_across_runs(planted: dict) -> None:
    _run(planted, "run1")
    _run(planted, "run2")
    root = planted["root"]
    for name in ("prompts/train.jsonl", "prompts/eval.jsonl", "metrics.json", "report.json"):
        assert (root / "run1" / name).read_bytes() == (root / "run2" / name).read_bytes(), name


def test_disabled_keeps_every_prompt(planted: dict) -> None:
    metrics, _, rows = _run(planted, "off", {"enabled": False}, total=67)
    assert "contaminated" not in metrics
    assert set(planted["contaminated"]) <= {r["messages"][-1]["content"] for r in rows}


def test_an_extra_file_outside_the_sets_folder_is_refused(planted: dict, tmp_path: Path) -> None:
    outside = tmp_path / "q.txt"
    outside.write_text(QUESTION + "\n", encoding="utf-8")
    from draftline.core.tracked import Untracked

    with pytest.raises(Untracked, match="decontaminate.extra"):
        _run(planted, "untracked", {"extra": [str(outside)]})


def test_the_threshold_counts_whole_ngrams() -> None:
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec"
    index = _index(words)  # 17 words, one sentence: 10 windows of 8
    assert index.sizes.tolist() == [10]
    # 3 of 10 windows reach 0.3 (in floats 0.3 * 10 is 3.0000000000000004).
    assert index.hits([" ".join(words.split()[:10])], 0.3) == [{0: 0.3}]


def test_an_extra_file_is_read_as_jsonl_or_one_question_a_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "humaneval.jsonl"
    jsonl.write_text("\n".join([json.dumps("a plain string"), json.dumps({"question": "a question"}),
                                json.dumps({"messages": [{"role": "system", "content": "sys"},
                                                         {"role": "user", "content": "turn one"}]}),
                                json.dumps({"answer": "no prompt"}), "{not json"]) + "\n", encoding="utf-8")
    skips = Skips(logging.getLogger("test"))
    got = extra_prompts(str(jsonl), skips)
    assert [(p.set, p.text) for p in got] == [("humaneval", "a plain string"), ("humaneval", "a question"),
                                              ("humaneval", "turn one")]
    assert skips.as_dict() == {"unreadable evaluation prompt": 2}
    text = tmp_path / "mbpp.txt"
    text.write_text("first question\n\nsecond question\n", encoding="utf-8")
    assert [(p.set, p.where.rsplit(":", 1)[1], p.text) for p in extra_prompts(str(text), skips)] == [
        ("mbpp", "1", "first question"), ("mbpp", "3", "second question")]
