"""The whole prompt stage on the real-row fixtures: exact totals, determinism, nothing written on failure."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import early_stages as run
import pytest
from conftest import default_params
from merge_support import chat_rows, write_legacy, write_tokenized
from merge_support import write_target as write_target_json

from draftline.conversations.params import ConversationsParams
from draftline.core import dataset as fmt
from draftline.core.classify import DOMAINS
from draftline.core.errors import MissingInput, Refusal
from draftline.core.jsonl import iter_jsonl
from draftline.core.raw import rows_to_table, write_raw
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE, Conversation
from draftline.core.runner import main, run_file
from draftline.core.skips import SkipError
from draftline.core.source_spec import SourceSpec
from draftline.core.target_loader import load_target, load_tokenizer
from draftline.prompts.blend import BlendError
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings
from draftline.prompts.stage import PromptsArgs, run_prompts
from draftline.target.params import TargetParams
from draftline.target.stage import write_target

SOURCES = {
    "glaive": ("agent_glaive_toolcall_sharegpt", "agent"),
    "agent_reason": ("agent_reason_tool_use_llamafactory_v1", "agent"),
    "codefeedback": ("codefeedback_filtered_instruction", "codefeedback"),
    "hermes": ("hermes_function_calling_v1", "hermes_fc"),
    "infinity_7m": ("infinity_instruct_7M", "infinity_instruct"),
    "infinity_gen": ("infinity_instruct_gen", "infinity_instruct"),
    "metamathqa": ("metamathqa", "metamathqa"),
    "http": ("openai_multimodal_request_bodies", "http_traces"),
}
PROMPTS = {"turns": "first", "strict": False, "tools_unsupported": "refuse"}
DEDUP = {"priority": ["hermes", "glaive"], "near": default_params("dedup", )["near"] | {"exact_numbers": ["metamathqa"]}}
CONVERSATIONS = ConversationsParams.parse({"multimodal": "drop", "strict": False}, "conversations")


def _conversations(root: Path, adapters: dict[str, str], params=CONVERSATIONS) -> Path:
    """Every source's raw rows (under ``root/raw``) through the conversations stage, into ``root/<tag>``."""
    out = root / ("conversations-" + "-".join(f"{n}.{a}" for n, a in sorted(adapters.items()))[:80])
    for name, adapter in adapters.items():
        run.conversations(root, name, SourceSpec.parse({"path": "x", "adapter": adapter}, f"sources.{name}"), params,
                          out=out)
    return out


@pytest.fixture(scope="module")
def env(datasets_dir: Path, qwen3_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stage")
    for name, (fixture, _) in SOURCES.items():
        rows = [json.loads(line) for line in (datasets_dir / f"{fixture}.jsonl").read_text().splitlines()]
        write_raw(rows_to_table(rows), root / "raw" / name)
    target = default_params("target", path=str(qwen3_tokenizer_dir))
    write_target(TargetParams.parse(target, "target"), root / "target")
    (root / "bases").mkdir()  # the stage's bases folder (merge.base must lie in it), as in a project
    return root


def _run(env: Path, out: str, blend: dict, prompts=PROMPTS, adapters=None, base: Path | None = None, stage=False,
         target_dir: Path | None = None):
    """The stage's report (its details) and the folder holding ``prompts/`` and its metrics, report and plot
    (against ``env``'s tokenizer-only target unless ``target_dir``)."""
    adapters = adapters or {name: a for name, (_, a) in SOURCES.items()}
    o = env / out
    settings = PromptsSettings(list(SOURCES), PromptsParams.parse(prompts, "prompts"), DedupParams.parse(DEDUP, "dedup"),
                               BlendParams.parse(blend, "blend"), False, str(base) if base else None)
    done = run.prompts(env, settings, out=o / "prompts", conversations_dir=_conversations(env, adapters),
                       target_dir=target_dir)
    return (done if stage else done.details), o


def _rows(path: Path) -> list[dict]:
    return [v for _, v, _ in iter_jsonl(path)]


BLEND = {"total": 40, "unit": "samples", "seed": 0, "eval": {"dev": 1, "test": 1}, "sources": {"codefeedback": {"whole": True}, "glaive": {"weight": 2}},
         "target_mix": None, "max_domain_share": None, "steer": None}


@pytest.mark.parametrize("total", [17, 40])
def test_gives_exactly_total_train_rows_and_a_disjoint_eval(env: Path, total: int) -> None:
    metrics, o = _run(env, f"n{total}", {**BLEND, "total": total})
    train, eval_ = _rows(o / "prompts/train.jsonl"), _rows(o / "prompts/eval.jsonl")
    assert len(train) == total == metrics["train_rows"]
    assert not {r["id"] for r in train} & {r["id"] for r in eval_}
    assert len({r["id"] for r in train}) == len(train)
    assert metrics["sources"]["codefeedback"]["achieved_rows"] == 1  # whole
    for r in train:
        assert set(r) == {"id", "source", "row", "messages", "tools", "reference"}
        assert r["messages"][-1]["role"] == "user"
    m = metrics["sources"]["http"]
    assert m["skipped"] == {"malformed": 1} and m["rows_read"] == 10
    assert m["available"] == m["prompts"] - m["exact_duplicates"] - m["near_duplicates"]
    # The stage's skips: every source's, by reason (what adapting and cutting prompts could not read).
    skips = sum((Counter(m["skipped"]) for m in metrics["sources"].values()), Counter())
    assert json.loads((o / "prompts-report.json").read_text()) == metrics | {"skips": dict(sorted(skips.items()))}
    headline = json.loads((o / "prompts-metrics.json").read_text())
    assert headline == {"rows": total, "tokens": metrics["train_tokens"], "eval_rows": sum(metrics["eval_rows"].values()),
                        "duplicates": sum(m["exact_duplicates"] + m["near_duplicates"] for m in metrics["sources"].values()),
                        "skipped": skips.total(), "mix": {d: metrics["mix"]["merged_shares"][d] for d in DOMAINS}}
    # The content mix: every train row has a domain, per source and in total; no base, so merged = new.
    assert sum(sum(m["domains"].values()) for m in metrics["sources"].values()) == total
    assert metrics["mix"]["merged_amounts"] == metrics["mix"]["new_amounts"]
    assert sum(metrics["mix"]["new_amounts"].values()) == total
    assert metrics["sources"]["codefeedback"]["domains"]["code"] == metrics["sources"]["codefeedback"]["achieved_rows"]
    assert (o / "prompts-mix.csv").read_text().splitlines()[0] == "source,series,rows"
    assert (o / "prompts-shares.csv").read_text().splitlines()[0] == "domain,series,share"


def test_two_runs_are_byte_identical(env: Path) -> None:
    _, a = _run(env, "a", BLEND)
    _, b = _run(env, "b", BLEND)
    for f in ("prompts/train.jsonl", "prompts/eval.jsonl", "prompts-mix.csv", "prompts-metrics.json",
              "prompts-report.json", "prompts-shares.csv", "prompts-languages.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert json.loads(run_file(a / "prompts-report.json").read_text())["stage_seconds"] >= 0  # the run's alone
    _, c = _run(env, "c", {**BLEND, "seed": 1})
    assert (a / "prompts/train.jsonl").read_bytes() != (c / "prompts/train.jsonl").read_bytes()


def test_unit_tokens_meets_total_within_one_row(env: Path) -> None:
    metrics, o = _run(env, "tok", {**BLEND, "unit": "tokens", "total": 15000})
    train = _rows(o / "prompts/train.jsonl")
    assert metrics["unit"] == "tokens" and metrics["requested_tokens"] == 15000
    tok = load_tokenizer(load_target(env / "target" / "target.json"))
    costs = [
        len(tok.apply_chat_template(r["messages"], tools=r["tools"], add_generation_prompt=True, tokenize=True,
                                    return_dict=False, enable_thinking=False))  # the run's thinking mode
        + len(tok(r["reference"] or "", add_special_tokens=False)["input_ids"])
        for r in train
    ]
    assert sum(costs) == metrics["train_tokens"]
    assert 15000 <= sum(costs) < 15000 + max(costs)


def test_infeasible_blend_fails_before_writing(env: Path) -> None:
    _, o = _run(env, "keep", BLEND)
    before = (o / "prompts/train.jsonl").read_bytes()
    with pytest.raises(BlendError, match=r"blend.total=5000 samples but only \d+ are available"):
        _run(env, "keep", {**BLEND, "total": 5000})
    assert (o / "prompts/train.jsonl").read_bytes() == before
    with pytest.raises(BlendError, match="whole sources hold"):
        _run(env, "none", {**BLEND, "total": 10, "sources": {"infinity_gen": {"whole": True}}})
    assert not (env / "none").exists()


def _script_argv(env: Path, target_json: Path, o: Path) -> list[str]:
    """The stage script's arguments, as dvc.yaml gives them, writing under ``o``."""
    return ["--conversations", str(_conversations(env, {n: a for n, (_, a) in SOURCES.items()})), "--target",
            str(target_json), "--out", str(o / "prompts"), "--metrics", str(o / "m.json"),
            "--report", str(o / "r.json"), "--plot", str(o / "mix.csv"),
            "--plot-shares", str(o / "shares.csv"), "--plot-languages", str(o / "languages.csv"),
            "--drafters", str(env / "drafters"), "--bases", str(env / "bases"), "--sets", str(env / "sets")]


def test_an_infeasible_blend_run_as_dvc_runs_it_prints_one_line_and_exits_1(env: Path, capsys) -> None:
    """The stage script's failure mode: an expected refusal is its message alone (a traceback is for bugs)."""
    settings = PromptsSettings(list(SOURCES), PromptsParams.parse(PROMPTS, "prompts"), DedupParams.parse(DEDUP, "dedup"),
                               BlendParams.parse({**BLEND, "total": 200000}, "blend"), False)
    o = env / "refused"
    argv = _script_argv(env, env / "target/target.json", o)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main("prompts", PromptsArgs, lambda _: settings, run_prompts, argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err  # progress bars, then the refusal
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("prompts: blend.total=200000 samples but only ")
    assert not o.exists()


def test_strict_stops_at_the_first_bad_row_naming_it(env: Path) -> None:
    strict = ConversationsParams.parse({"multimodal": "drop", "strict": True}, "conversations")
    with pytest.raises(SkipError, match="hermes row 1: bad_tools"):
        run.conversations(env, "hermes", SourceSpec.parse({"path": "x", "adapter": "hermes_fc"}, "sources.hermes"),
                          strict, out=env / "strict")
    assert not (env / "strict" / "hermes").exists()


def test_all_bad_source_warns_and_gives_zero_rows(env: Path, caplog: pytest.LogCaptureFixture) -> None:
    # codefeedback's rows read with the hermes preset have no conversations: every row is malformed.
    adapters = {name: a for name, (_, a) in SOURCES.items()}
    adapters["codefeedback"] = "hermes_fc"
    metrics, _ = _run(env, "bad", {**BLEND, "sources": {}}, adapters=adapters)
    assert metrics["sources"]["codefeedback"]["achieved_rows"] == 0
    assert metrics["sources"]["codefeedback"]["skipped"] == {"malformed": 1}
    assert metrics["train_rows"] == 40
    assert "codefeedback gave no usable prompts" in caplog.text


def test_prompts_strict_stops_at_a_conversation_with_no_prompt(env: Path, tmp_path: Path) -> None:
    """prompts.strict governs cutting prompts (adapting is conversations.strict's): a conversation without a user
    turn stops the stage, naming it, and nothing is written."""
    folder = tmp_path / "conversations" / "x"
    folder.mkdir(parents=True)
    (folder / CONVERSATIONS_FILE).write_text(
        Conversation(source="x", row=0, messages=[{"role": "assistant", "content": "hi"}]).to_json() + "\n")
    (folder / CONVERSATIONS_STATS_FILE).write_text(json.dumps({"rows_read": 1, "skipped": {}, "media_parts_dropped": 0}))
    blend = {**BLEND, "total": 0, "sources": {}}
    settings = PromptsSettings(
        ["x"], PromptsParams.parse({**PROMPTS, "strict": True}, "prompts"),
        DedupParams.parse({**DEDUP, "priority": [], "near": {**DEDUP["near"], "exact_numbers": []}}, "dedup"),
        BlendParams.parse(blend, "blend"), False)
    with pytest.raises(SkipError, match="x row 0: no_user"):
        run.prompts(tmp_path, settings, out=tmp_path / "p", target_dir=env / "target")
    assert not (tmp_path / "p").exists()


# A base skewed as the reference run's was: 77% code (a legacy folder: its mix is labelled from its tokens).
SKEWED = ["code"] * 77 + ["math"] * 8 + ["tool_use"] * 5 + ["general"] * 10


@pytest.fixture(scope="module")
def skewed_base(env: Path, qwen3_tokenizer_dir: Path) -> Path:
    folder = env / "bases" / "skewed"  # where the stage's bases folder keeps it
    write_legacy(folder, chat_rows(qwen3_tokenizer_dir, SKEWED))
    return folder


def test_target_mix_brings_the_merged_set_exactly_to_the_request(env: Path, skewed_base: Path) -> None:
    target = {"code": 0.6, "math": 0.1, "tool_use": 0.15, "general": 0.15}
    stage, o = _run(env, "aimed", {**BLEND, "target_mix": target}, base=skewed_base, stage=True)
    mix = stage.details["mix"]
    assert mix["base_amounts"] == {"code": 77, "math": 8, "tool_use": 5, "general": 10}
    # 140 merged rows: code 84 = 77 + 7 new, math 14 = 8 + 6, tool_use 21 = 5 + 16, general 21 = 10 + 11.
    assert mix["new_amounts"] == {"code": 7, "math": 6, "tool_use": 16, "general": 11} == mix["aimed_new_amounts"]
    assert mix["merged_shares"] == target and mix["requested_shares"] == target
    assert len(_rows(o / "prompts/train.jsonl")) == 40
    # whole: true still takes codefeedback in full; its one row counts towards code's 7.
    assert stage.details["sources"]["codefeedback"]["achieved_rows"] == stage.details["sources"]["codefeedback"]["available"] - 0
    headline = json.loads((o / "prompts-metrics.json").read_text())
    assert headline["mix"] == target
    shares = (o / "prompts-shares.csv").read_text().splitlines()
    assert "code,requested,0.6" in shares and "code,merged,0.6" in shares and "code,base,0.77" in shares
    # The base was labelled by the first run; this one reads the cached labels.
    again, _ = _run(env, "aimed2", {**BLEND, "target_mix": target}, base=skewed_base, stage=True)
    assert again.run["base_mix"]["shards_labelled"] == 0 and again.run["base_mix"]["shards_cached"] >= 1
    assert again.details == stage.details


def test_an_unreachable_target_fails_before_writing_naming_the_closest_mix(env: Path, skewed_base: Path) -> None:
    # 40 new rows cannot bring a 77%-code base of 100 rows down to 40% code: 77 of 140 is 55% at best.
    with pytest.raises(BlendError, match=r"blend.target_mix .* cannot be met .* closest achievable merged mix is "
                                         r"\{code: 0\.55\d, .*set blend.target_mix to it"):
        _run(env, "unreachable", {**BLEND, "target_mix": {"code": 0.4, "math": 0.2, "tool_use": 0.1, "general": 0.3}},
             base=skewed_base)
    assert not (env / "unreachable").exists()


def test_max_domain_share_stops_an_over_skewed_blend_before_writing(env: Path, skewed_base: Path) -> None:
    with pytest.raises(BlendError, match=r"the merged set would be 60\.7% code \(85 of 140 samples: base 77, new 8\), over blend.max_domain_share=0.5"):
        _run(env, "skewed", {**BLEND, "max_domain_share": 0.5}, base=skewed_base)
    assert not (env / "skewed").exists()
    details, _ = _run(env, "fine", {**BLEND, "max_domain_share": 0.5})  # the new rows alone: within it
    assert max(details["mix"]["merged_shares"].values()) <= 0.5


@pytest.mark.parametrize("layout", ["draftline", "legacy"])
def test_a_damaged_base_is_refused_by_name_before_its_mix_is_read(env: Path, qwen3_tokenizer_dir: Path, tmp_path: Path,
                                                                  layout: str) -> None:
    """A shard cut in half, as by a bad copy: a draftline base fails its recorded checksum, another tool's folder
    (no checksum) is named as not a whole Arrow stream; one line either way, nothing written."""
    base, table = env / "bases" / f"damaged-{layout}", chat_rows(qwen3_tokenizer_dir, SKEWED[:30])
    if layout == "draftline":
        write_tokenized(base, table, write_target_json(tmp_path / "target.json", qwen3_tokenizer_dir), max_shard_bytes=2000)
    else:
        write_legacy(base, table)
    shard = base / fmt.shard_files(base)[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    why = "truncated" if layout == "draftline" else "not a whole Arrow stream"
    with pytest.raises(fmt.CorruptShardError, match=f"{shard.name}.*{why}"):
        _run(env, f"damaged_{layout}", {**BLEND, "max_domain_share": 0.9}, base=base)
    assert not (env / f"damaged_{layout}").exists()


MODEL = "a" * 64  # the model fingerprint of the target the refusals below are read against


@pytest.mark.parametrize("change, why", [
    ({"target": {"tokenizer_fingerprint": "f" * 64}}, "another target: target.tokenizer_fingerprint ffffffffffff vs"),
    ({"model_fingerprint": "b" * 64}, "another target model: target.model_fingerprint bbbbbbbbbbbb vs this target's "
                                      "aaaaaaaaaaaa"),
    ({"model_fingerprint": None}, "another target model: target.model_fingerprint None vs"),
    ({"target": None}, "records no target"),
    ({"splits": {"test": {}}}, "has splits ['test'], no 'dev': steering reads dev only"),
    ({"per_source": {"glaive": 4.0}}, "per_source.glaive is 4.0"),
    ({"per_source": {"glaive": {"acceptance": "high"}}}, "per_source.glaive.acceptance is 'high'"),
    ({"per_source": {"other_source": {"acceptance": 3.0}}}, "measured none of the weighted sources"),
    ({"splits": {"dev": {"sampled": ["not", "figures"]}}}, "has no per-source figures in"),
])
def test_steer_refuses_an_evaluation_it_cannot_use_in_one_line(env: Path, tmp_path: Path, change: dict, why: str
                                                              ) -> None:
    from draftline.prompts.steer import read_evaluation, steer_factors

    ours = load_target(env / "target" / "target.json").tokenizer_fingerprint
    dev = {"sampled": {"per_source": change.get("per_source", {"glaive": {"acceptance": 4.0}})}}
    evaluation = {"target": change.get("target", {"tokenizer_fingerprint": ours,
                                                  "model_fingerprint": change.get("model_fingerprint", MODEL)}),
                  "splits": change.get("splits", {"dev": dev})}
    (tmp_path / "eval.json").write_text(json.dumps(evaluation))
    with pytest.raises(Refusal, match=re.escape(why)):
        path = tmp_path / "eval.json"
        steer_factors({"glaive": 1.0, "hermes": 1.0}, read_evaluation(path, ours, MODEL), "sampled", 1.0, path)


def test_steer_refuses_an_evaluation_of_other_weights_under_the_same_tokenizer(env: Path, tmp_path: Path,
                                                                            qwen3_tokenizer_dir: Path) -> None:
    """The stage checks the target's model fingerprint, not only its tokenizer's: a target with weights, steered by
    an evaluation of other weights under the same tokenizer, is refused in one line naming both, nothing written."""
    import torch
    from safetensors.torch import save_file

    folder = Path(shutil.copytree(qwen3_tokenizer_dir, tmp_path / "model"))
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 151936,
                                                    "num_hidden_layers": 2, "hidden_size": 8}))
    save_file({"weight": torch.zeros(4)}, folder / "model.safetensors")
    write_target(TargetParams.parse(default_params("target", path=str(folder)), "target"), tmp_path / "target")
    info = load_target(tmp_path / "target" / "target.json")
    assert info.model_fingerprint is not None
    report = env / "drafters" / "other-weights.eval.json"
    report.parent.mkdir(exist_ok=True)
    dev = {"sampled": {"per_source": {"glaive": {"acceptance": 4.0}}}}
    report.write_text(json.dumps({"target": {"tokenizer_fingerprint": info.tokenizer_fingerprint,
                                             "model_fingerprint": "0" * 64}, "splits": {"dev": dev}}))
    steer = {"eval": str(report), "setting": "sampled", "strength": 1.0}
    with pytest.raises(Refusal) as refused:
        _run(env, "other_weights", {**BLEND, "steer": steer}, target_dir=tmp_path / "target")
    assert str(refused.value) == (
        f"blend.steer.eval: {report} evaluated another target model: target.model_fingerprint 000000000000 vs this "
        f"target's {info.model_fingerprint[:12]}; steer by an evaluation of this target's drafter")
    assert not (env / "other_weights").exists()


def test_target_mix_in_tokens_meets_each_domain_within_a_row(env: Path) -> None:
    target = {"code": 0.25, "math": 0.25, "tool_use": 0.25, "general": 0.25}
    details, _ = _run(env, "aimed_tokens", {**BLEND, "unit": "tokens", "total": 6000, "target_mix": target,
                                            "sources": {}})
    mix = details["mix"]
    assert mix["aimed_new_amounts"] == {d: 1500 for d in DOMAINS}
    assert all(1500 <= mix["new_amounts"][d] < 1500 + 2000 for d in DOMAINS)


def test_a_bases_prompts_are_never_picked_again_and_the_eval_split_stays(env: Path, tmp_path: Path) -> None:
    """merge.base's prompt ids leave the train pool after the eval split: the next round's new prompts are new,
    its eval prompts the same."""
    from drafter_support import make_merged, make_rows

    first, o1 = _run(env, "round1", {**BLEND, "total": 17})
    train1 = [r["id"] for r in _rows(o1 / "prompts/train.jsonl")]
    rows = make_rows(len(train1))
    rows["id"] = train1
    # A draftline dataset whose rows are round 1's prompts, where the stage's bases folder keeps it.
    base = make_merged(tmp_path, rows).rename(env / "bases" / "round1")
    second, o2 = _run(env, "round2", {**BLEND, "total": 17}, base=base)
    train2 = [r["id"] for r in _rows(o2 / "prompts/train.jsonl")]
    assert len(train2) == 17 and not set(train2) & set(train1)
    assert _rows(o2 / "prompts/eval.jsonl") == _rows(o1 / "prompts/eval.jsonl")
    assert second["in_base"] == 17 == sum(m["in_base"] for m in second["sources"].values())
    assert first["in_base"] == 0


def test_steer_scales_weights_by_how_far_a_source_lags(env: Path, tmp_path: Path) -> None:
    from draftline.core.splits import split_of
    from draftline.prompts.steer import check_prompt_set, read_evaluation, steer_factors

    plain, o = _run(env, "unsteered", {**BLEND, "total": 17})
    dev_ids = [r["id"] for r in _rows(o / "prompts/eval.jsonl") if split_of(r["id"]) == "dev"]
    report = env / "drafters" / "round1.eval.json"  # where the stage's dependency folder keeps it
    report.parent.mkdir(exist_ok=True)
    ours = load_target(env / "target" / "target.json").tokenizer_fingerprint
    per_source = {"glaive": {"acceptance": 4.0}, "agent_reason": {"acceptance": 2.0}, "hermes": {"acceptance": 3.2}}
    # What evaluate writes: the dev split's figures per setting, with every dev request it decoded; a test split
    # that says the opposite, which steering must never read.
    dev = {"sampled": {"per_source": per_source, "per_request": {f"heldout/{i}#0": ["x", 9, 3] for i in dev_ids}}}
    test = {"sampled": {"per_source": {s: {"acceptance": 10 - x["acceptance"]} for s, x in per_source.items()}}}
    evaluation = {"target": {"tokenizer_fingerprint": ours}, "splits": {"dev": dev, "test": test}}
    report.write_text(json.dumps(evaluation))
    weights = {"glaive": 2.0, "agent_reason": 1.0, "hermes": 1.0, "http": 1.0}
    read = read_evaluation(report, ours, None)  # env's target has no weights: its tokenizer is checked
    f = steer_factors(weights, read, "sampled", 1.0, report)
    assert {s: x["factor"] for s, x in f.items()} == {"glaive": 1.0, "agent_reason": 2.0, "hermes": 1.25, "http": 1.0}
    assert steer_factors(weights, read, "sampled", 2.0, report)["agent_reason"]["factor"] == 4.0
    assert {x["factor"] for x in steer_factors(weights, read, "sampled", 0.0, report).values()} == {1.0}
    with pytest.raises(Refusal) as refused:  # a setting the evaluation did not decode: named, with what it has
        steer_factors(weights, read, "greedy", 1.0, report)
    assert str(refused.value) == (f"blend.steer.setting 'greedy' has no per-source figures in {report}'s dev split; "
                                  "it has ['sampled']")
    with pytest.raises(MissingInput) as missing:
        read_evaluation(tmp_path / "none.json", ours, None)
    assert str(missing.value) == (f"blend.steer.eval: {tmp_path / 'none.json'} does not exist; keep the previous "
                                  "round's reports/eval.json under data/drafters/ (README \"Rounds\")")
    (tmp_path / "cut.json").write_text('{"splits": {"dev": ')  # a report cut half-way: refused, named
    with pytest.raises(Refusal, match="not an evaluate report"):
        read_evaluation(tmp_path / "cut.json", ours, None)
    # In the stage: the report shows what steered and the requested, steered and achieved shares; the lagging
    # source (on dev) gains rows.
    steer = {"eval": str(report), "setting": "sampled", "strength": 3.0}
    steered, _ = _run(env, "steered", {**BLEND, "total": 17, "steer": steer})
    assert {k: steered["steer"][k] for k in ("eval", "split", "setting")} == {"eval": str(report), "split": "dev",
                                                                              "setting": "sampled"}
    table = steered["steer"]["sources"]
    assert table["agent_reason"]["factor"] == 8.0 and table["agent_reason"]["steered"] > table["agent_reason"]["requested"]
    assert "codefeedback" not in table  # whole: taken in full, never steered
    assert steered["sources"]["agent_reason"]["achieved_rows"] > plain["sources"]["agent_reason"]["achieved_rows"]
    assert steered["train_rows"] == plain["train_rows"] == 17
    # An evaluation of other prompts (another prompt set: other samples, seed or quotas) is refused by name.
    dev["sampled"]["per_request"]["heldout/not-one-of-ours#0"] = ["x", 9, 3]
    report.write_text(json.dumps(evaluation))
    with pytest.raises(Refusal, match=r"evaluated another prompt set: 1 of its \d+ held-out dev prompts .*not-one-of"):
        _run(env, "foreign", {**BLEND, "total": 17, "steer": steer})
    assert not (env / "foreign").exists()
    # One that does not say which prompts it measured is refused too, not taken on trust.
    for requests in (None, ["heldout/x#0"]):
        dev["sampled"]["per_request"] = requests
        with pytest.raises(Refusal, match="no per-request figures in its dev split"):
            check_prompt_set(dev, "sampled", set(dev_ids), report)


def test_a_base_outside_the_bases_folder_is_refused_with_the_fix_before_it_is_read(env: Path, tmp_path: Path,
                                                                                   skewed_base: Path) -> None:
    """The stage reads merge.base (its mix, its prompt ids): outside the bases folder DVC tracks for it, a changed
    base would not rerun it. Refused in one line naming merge.base, its value, the folder and the fix, before any
    of it is read (a shard of this copy is cut short, which reading would refuse otherwise), nothing written."""
    from draftline.core.tracked import Untracked

    outside = Path(shutil.copytree(skewed_base, tmp_path / "round0"))
    shard = outside / fmt.shard_files(outside)[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(Untracked) as refused:
        _run(env, "base_untracked", {**BLEND, "max_domain_share": 0.9}, base=outside)
    bases, inside = env / "bases", env / "bases" / "round0"
    assert str(refused.value) == (
        f"params.yaml: merge.base ({outside}) is outside {bases}, which DVC tracks for this stage: a change to it "
        f"would not rerun the stage. Copy it in and track it: cp -r {outside} {inside} && dvc add {inside}; then set "
        f"merge.base: {inside}")
    assert not (env / "base_untracked").exists()


def test_a_steer_file_outside_the_tracked_folder_is_refused_with_the_fix(env: Path, tmp_path: Path) -> None:
    """DVC cannot see an evaluation outside the stage's drafters folder change: refused before anything is read.
    Every input here would be refused if read (no target, no conversations, a cut evaluation), so the refusal
    that comes is the first check the stage makes."""
    from draftline.core.tracked import Untracked

    outside = tmp_path / "eval.json"
    outside.write_text('{"splits": {"dev": ')
    steer = {"eval": str(outside), "setting": "sampled", "strength": 1.0}
    settings = PromptsSettings(list(SOURCES), PromptsParams.parse(PROMPTS, "prompts"), DedupParams.parse(DEDUP, "dedup"),
                               BlendParams.parse({**BLEND, "steer": steer}, "blend"), False)
    with pytest.raises(Untracked) as refused:
        run.prompts(env, settings, out=env / "untracked" / "prompts", conversations_dir=tmp_path / "no-conversations",
                    target_dir=tmp_path / "no-target")
    drafters, inside = env / "drafters", env / "drafters" / "eval.json"
    assert str(refused.value) == (
        f"params.yaml: blend.steer.eval ({outside}) is outside {drafters}, which DVC tracks for this stage: a change "
        f"to it would not rerun the stage. Copy it in and track it: cp -r {outside} {inside} && dvc add {inside}; "
        f"then set blend.steer.eval: {inside}")
    assert not (env / "untracked").exists()


@pytest.fixture(scope="module")
def chatml_target(env: Path, chatml_tokenizer_dir: Path) -> Path:
    """A target whose chat template has neither tools nor thinking (SmolLM2's ChatML), beside ``env``'s."""
    write_target(TargetParams.parse(default_params("target", path=str(chatml_tokenizer_dir)), "target"),
                 env / "chatml-target")
    return env / "chatml-target"


def _settings(blend: dict, tools_unsupported: str, enable_thinking: bool = False) -> PromptsSettings:
    return PromptsSettings(list(SOURCES), PromptsParams.parse({**PROMPTS, "tools_unsupported": tools_unsupported},
                                                              "prompts"),
                           DedupParams.parse(DEDUP, "dedup"), BlendParams.parse(blend, "blend"), enable_thinking)


def test_tool_sources_under_a_template_without_tools_are_refused_in_one_line(env: Path, chatml_target: Path,
                                                                             capsys) -> None:
    o = env / "tools_refused"
    argv = _script_argv(env, chatml_target / "target.json", o)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main("prompts", PromptsArgs, lambda _: _settings(BLEND, "refuse"), run_prompts, argv)
    assert exit_.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"prompts: the target's chat template does not render tools, and prompts offer them "
                        r"\((\d+ of \w+, )*\d+ of hermes(, \d+ of \w+)*\): set prompts.tools_unsupported: drop .*", last)
    assert not o.exists()


def test_tool_prompts_under_a_template_without_tools_are_dropped_counted_the_rest_kept(env: Path,
                                                                                       chatml_target: Path) -> None:
    conversations = _conversations(env, {n: a for n, (_, a) in SOURCES.items()})
    blend = {**BLEND, "total": 20}  # what the sources hold without their tool prompts
    qwen3 = run.prompts(env, _settings(blend, "drop"), out=env / "tools_kept" / "prompts",
                        conversations_dir=conversations).details  # a template with tools: nothing dropped
    stage = run.prompts(env, _settings(blend, "drop"), out=env / "tools_dropped" / "prompts",
                        conversations_dir=conversations, target_dir=chatml_target)
    dropped = {s: m["skipped"].get("tools_unsupported", 0) for s, m in stage.details["sources"].items()}
    assert not any(m["skipped"].get("tools_unsupported") for m in qwen3["sources"].values())
    assert dropped["hermes"] > 0 and stage.skips.counts["tools_unsupported"] == sum(dropped.values())
    for s, m in stage.details["sources"].items():  # every prompt is either kept or counted as dropped
        assert m["prompts"] + dropped[s] == qwen3["sources"][s]["prompts"], s
    train = _rows(env / "tools_dropped" / "prompts" / "train.jsonl")
    assert len(train) == 20 and not any(r["tools"] for r in train)
    assert not any(r["tools"] for r in _rows(env / "tools_dropped" / "prompts" / "eval.jsonl"))
    report = json.loads((env / "tools_dropped" / "prompts-report.json").read_text())
    assert report["skips"]["tools_unsupported"] == sum(dropped.values())


def test_enable_thinking_under_a_template_without_thinking_is_refused_before_a_row_is_read(
        env: Path, chatml_target: Path, tmp_path: Path) -> None:
    with pytest.raises(Refusal, match=r"generate.enable_thinking is true, but the target's chat template has no "
                                      r"thinking mode"):
        run.prompts(env, _settings(BLEND, "drop", enable_thinking=True), out=env / "thinking" / "prompts",
                    conversations_dir=tmp_path / "none", target_dir=chatml_target)  # no conversations: never read
    assert not (env / "thinking").exists()
