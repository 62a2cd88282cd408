"""``blend.select``: scoring candidates by a drafter (teacher-forced acceptance) and picking within a source by it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import default_params
from drafter_support import untrained_drafter

from draftline.core.errors import Refusal
from draftline.core.records import PromptRecord
from draftline.core.target import load_model, load_target, load_tokenizer
from draftline.drafter.config import DrafterMismatch
from draftline.prompts.blend import Pool, hash_rank, select
from draftline.prompts.params import SelectParams
from draftline.prompts.score import (
    ScoreCache,
    anchor_positions,
    leading_matches,
    score_windows,
    target_pass,
    window,
)
from draftline.prompts.select import (
    DrafterChoice,
    correlation,
    drafter_scorer,
    order_by_rule,
    request_acceptance,
)

BLOCK = 4


def _params(**overrides) -> SelectParams:
    return SelectParams.parse(default_params("blend")["select"] | overrides, "blend.select")


def _records(n: int) -> list[PromptRecord]:
    words = ["alpha", "beta", "gamma", "delta", "omega", "tool", "call", "result", "sum", "code"]
    out = []
    for i in range(n):
        answer = " ".join(words[(i * 3 + k * (i % 4 + 1)) % len(words)] for k in range(12 + i % 5))
        out.append(PromptRecord(id=f"p{i:03d}", source="s", row=i,
                                messages=[{"role": "user", "content": f"Question {i}: {words[i % 10]}?"}],
                                reference=answer))
    return out


def test_anchors_are_spread_over_the_answer_and_stay_inside_it() -> None:
    assert anchor_positions(10, 20, 4) == [10, 12, 14, 16]
    assert anchor_positions(10, 13, 8) == [10, 11]  # only two blocks fit: each drafts the position after it
    assert anchor_positions(10, 11, 8) == []


def test_leading_matches_stop_at_the_first_miss() -> None:
    t = torch.tensor
    assert leading_matches(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert leading_matches(t([9, 2]), t([1, 2])) == 0
    assert leading_matches(t([1, 2, 3]), t([1, 2])) == 2  # the window ends: nothing past it is verified


def test_hardest_first_and_the_weighted_draw_is_deterministic() -> None:
    ids = [f"r{i}" for i in range(40)]
    scores = {i: 1.0 + (n % 4) for n, i in enumerate(ids)}  # 1 (hard) .. 4 (a perfect block of 4)
    hardest = order_by_rule(ids, scores, "hardest", 0, BLOCK)
    assert [scores[i] for i in hardest] == sorted(scores.values())
    assert hardest[:10] == [i for i in ids if scores[i] == 1.0]  # ties keep the hash rank's order
    drawn = order_by_rule(ids, scores, "sample", 0, BLOCK)
    assert drawn == order_by_rule(ids, scores, "sample", 0, BLOCK) != order_by_rule(ids, scores, "sample", 1, BLOCK)
    assert all(scores[i] == 4.0 for i in drawn[-10:])  # weight 0 (nothing to gain) comes last
    first = drawn[:20]
    assert sum(scores[i] == 1.0 for i in first) > sum(scores[i] == 3.0 for i in first)
    mixed = order_by_rule(ids, scores, "mix", 0, BLOCK)
    assert sorted(mixed) == sorted(ids)  # every candidate once
    # alternately the hardest left (r0, r4, ...) and the next in hash rank not yet taken (r1, r2, ...)
    assert mixed[:6] == ["r0", "r1", "r4", "r2", "r8", "r3"]


@pytest.fixture(scope="module")
def tiny(embedded_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """The embedded test target (model and tokenizer), an untrained drafter for it, and 24 candidates."""
    info = load_target(embedded_target / "target.json")
    drafters = tmp_path_factory.mktemp("drafters")
    untrained_drafter(embedded_target / "target.json", drafters / "round1", block_size=BLOCK, tapped=2)
    return info, load_tokenizer(info), load_model(info), drafters / "round1", _records(24)


class Oracle:
    """A fake drafter that drafts the target's own choices for the ``easy`` candidates (a perfect block) and a wrong
    token for every other: it knows each candidate's ids and choices, found by the tokens it is shown."""

    block_size = BLOCK
    target_layer_ids: list[int] = []

    def __init__(self, rows: list[tuple[torch.Tensor, torch.Tensor, bool]]):
        self.rows = rows

    def reset(self) -> None:
        pass

    def propose(self, ctx) -> torch.Tensor:
        n = len(ctx.tokens)
        ids, choices, easy = next(r for r in self.rows if len(r[0]) >= n and torch.equal(r[0][:n], ctx.tokens))
        want = choices[n - 1 : n - 1 + BLOCK - 1]
        return want if easy else (want + 1) % 600


def test_a_drafter_perfect_on_half_the_candidates_makes_selection_take_the_other_half(tiny, tmp_path) -> None:
    info, tokenizer, target, _, records = tiny
    windows = {r.id: window(r, tokenizer, False, 64) for r in records}
    easy = {r.id for r in records if hash_rank(7, r.id) % 2 == 0}
    assert 6 <= len(easy) <= 18
    rows = [(ids, choices, rid in easy) for rid, w in windows.items()
            for ids, _, choices in target_pass(target, [w], [])]
    oracle = Oracle(rows)

    def score(batch):
        got = score_windows(target, oracle, [windows[r.id] for r in batch], 4, 512, ScoreCache(tmp_path / "cache"))
        return {r.id: got[windows[r.id].key] for r in batch}

    pool = Pool("s", [r.id for r in records], [1] * len(records), weight=1.0)
    hashed = select([pool], len(records) - len(easy), "samples")
    choice = DrafterChoice(_params(by="drafter", drafter="x", pool=100), 0, BLOCK, score)
    chosen = select(choice.reorder([pool], hashed, {r.id: r for r in records}), len(records) - len(easy), "samples")
    assert set(chosen.train_ids["s"]) == {r.id for r in records} - easy
    assert set(hashed.train_ids["s"]) != set(chosen.train_ids["s"])
    report = choice.describe(chosen)["sources"]["s"]
    assert report["candidates"] == len(records) and report["unscored"] == 0
    assert report["chosen"]["mean"] == 1.0 < report["pool"]["mean"]  # every chosen block rejected at once


def test_the_real_drafter_scores_the_same_twice_and_the_cache_is_read_not_recomputed(tiny, tmp_path, monkeypatch):
    info, tokenizer, _, drafter, records = tiny
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    params = _params(by="drafter", drafter=str(drafter), anchors=4, max_tokens=64, batch_tokens=256)
    first_stats, again_stats = {}, {}
    score, block = drafter_scorer(params, info, tokenizer, False, first_stats)
    first = score(records)
    again = drafter_scorer(params, info, tokenizer, False, again_stats)[0](records)
    assert block == BLOCK and first == again
    assert all(1.0 <= s <= BLOCK for s in first.values())
    assert first_stats["from_cache"] == 0 and again_stats["from_cache"] == again_stats["scored"] == len(records)
    # A damaged cache file is counted and its candidates scored again, to the same values.
    (cached,) = [p for p in (tmp_path / "cache").rglob("scores-*.json")][:1]
    cached.write_text(cached.read_text().replace("1", "2", 1))
    damaged: dict = {}
    assert drafter_scorer(params, info, tokenizer, False, damaged)[0](records) == first
    assert damaged["damaged_cache_files"] == 1 and damaged["from_cache"] < len(records)


def test_a_prompt_without_an_answer_gets_no_score(tiny, tmp_path, monkeypatch):
    info, tokenizer, _, drafter, records = tiny
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    bare = PromptRecord(id="bare", source="s", row=99, messages=records[0].messages, reference=None)
    score, _ = drafter_scorer(_params(by="drafter", drafter=str(drafter), max_tokens=64), info, tokenizer, False, {})
    assert score([bare, records[0]])["bare"] is None


def test_a_foreign_drafter_is_refused_in_one_line(tiny, tmp_path):
    info, tokenizer, _, drafter, _ = tiny
    foreign = tmp_path / "foreign"
    shutil.copytree(drafter, foreign)
    config = json.loads((foreign / "config.json").read_text())
    config["draftline"]["tokenizer_fingerprint"] = "f" * 64
    (foreign / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterMismatch, match="another tokenizer"):
        drafter_scorer(_params(by="drafter", drafter=str(foreign)), info, tokenizer, False, {})


def test_the_rank_correlation_reads_each_prompts_turns_from_the_evaluation() -> None:
    per_request = {"heldout/a#0": ["s", 10, 5], "heldout/a#1": ["s", 2, 2], "heldout/b#0": ["s", 9, 3],
                   "heldout/c#0": ["t", 4, 4], "heldout/d#0": ["s", 8, 8], "heldout/e#0": ["s", 6, 4],
                   "heldout/f#0": ["s", 5, 2], "heldout/g#0": ["s", 3, 1], "gsm8k/x#0": ["gsm8k", 9, 1]}
    measured = request_acceptance(per_request)
    assert measured == {"a": 12 / 7, "b": 3.0, "c": 1.0, "d": 1.0, "e": 1.5, "f": 2.5, "g": 3.0}
    scores = {"a": 2.0, "b": 3.5, "c": 1.2, "d": 1.1, "e": 1.9, "f": 2.5, "g": 3.4, "x": 4.0}
    with pytest.raises(Refusal, match="not \\[source, tokens, steps\\]"):
        request_acceptance({"heldout/a#0": ["s", "ten", 5]})
    got = correlation(scores, {i: "t" if i == "c" else "s" for i in "abcdefg"}, measured)
    s = got["per_source"]["s"]
    assert s["n"] == 6 and 0.9 < s["spearman"] < 1.0 and s["ci"][0] < s["spearman"] < s["ci"][1] <= 1.0
    assert got["per_source"]["t"] == {"n": 1, "spearman": None}  # too few to rank
    assert got["all"]["n"] == 7


def test_the_stage_picks_by_the_drafter_within_the_hash_amounts_and_reports_it(tiny, embedded_target, datasets_dir,
                                                                                tmp_path, monkeypatch):
    """The prompt stage with ``blend.select: {by: drafter}``: the same amounts per source as by hash, other rows,
    the score report and plot; the same rows again on a rerun (read from the cache)."""
    import early_stages as run

    from draftline.conversations.params import ConversationsParams
    from draftline.core.raw import rows_to_table, write_raw
    from draftline.core.source_spec import SourceSpec
    from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings

    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    sources = {"gen": "infinity_instruct_gen", "seven": "infinity_instruct_7M"}
    conversations = ConversationsParams.parse({"multimodal": "drop", "strict": False}, "conversations")
    for name, fixture in sources.items():
        rows = [json.loads(line) for line in (datasets_dir / f"{fixture}.jsonl").read_text().splitlines()]
        write_raw(rows_to_table(rows), tmp_path / "raw" / name)
        run.conversations(tmp_path, name, SourceSpec.parse({"path": "x", "adapter": "infinity_instruct"}, f"sources.{name}"),
                          conversations)
    drafters = tmp_path / "drafters"
    shutil.copytree(tiny[3], drafters / "round1")
    (tmp_path / "bases").mkdir()

    def stage(out: str, **select):
        blend = default_params("blend", total=6, eval={"dev": 0, "test": 0}, select=select)
        blend["sources"] = {name: {"weight": 1} for name in sources}
        settings = PromptsSettings(list(sources), PromptsParams.parse(default_params("prompts"), "prompts"),
                                   DedupParams.parse(default_params("dedup", priority=[], near={"exact_numbers": []}), "dedup"),
                                   BlendParams.parse(blend, "blend"), False)
        done = run.prompts(tmp_path, settings, out=tmp_path / out, target_dir=embedded_target, drafters=drafters)
        return done, [json.loads(line) for line in (tmp_path / out / "train.jsonl").read_text().splitlines()]

    _, hashed = stage("hash")
    # An untrained drafter scores every candidate alike, so the draw (not the hash rank) decides: other rows.
    by = {"by": "drafter", "drafter": str(drafters / "round1"), "pool": 2, "max_tokens": 64, "rule": "sample"}
    done, chosen = stage("drafter", **by)
    again_done, again = stage("again", **by)
    count = lambda rows: {s: sum(r["source"] == s for r in rows) for s in sources}  # noqa: E731
    assert count(chosen) == count(hashed) == {"gen": 3, "seven": 3}
    assert chosen != hashed and chosen == again and again_done.run["from_cache"] == again_done.run["scored"] > 0
    report = done.details["select"]["sources"]
    available = {s: done.details["sources"][s]["available"] for s in sources}
    assert {s: x["candidates"] for s, x in report.items()} == {s: min(n, 6) for s, n in available.items()}
    plot = (tmp_path / "drafter-scores.csv").read_text().splitlines()
    assert plot[0] == "source,series,score" and len(plot) == 1 + 2 * len(sources)


def test_a_drafter_outside_the_tracked_folder_is_refused_before_any_work(tmp_path):
    import early_stages as run

    from draftline.core.tracked import Untracked
    from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings

    blend = default_params("blend", select={"by": "drafter", "drafter": str(tmp_path / "elsewhere" / "round1")})
    settings = PromptsSettings(list(blend["sources"]), PromptsParams.parse(default_params("prompts"), "prompts"),
                               DedupParams.parse(default_params("dedup"), "dedup"), BlendParams.parse(blend, "blend"),
                               False)
    with pytest.raises(Untracked, match="blend.select.drafter"):
        run.prompts(tmp_path, settings)
