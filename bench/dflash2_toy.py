"""DFlash 1 against DFlash 2, from scratch and warm-started, on a toy target: a small stand-in for issue 23's item 7.

Not the embedded default (its target takes most of a `dvc repro`): a 6-layer Qwen3 target (vocabulary 256, hidden
64) taught a counting language for a few hundred steps writes its own greedy continuations of prompts of that
language, as the generate stage has the target write the training answers; the train stage (the stage runner's
``execute``, params.yaml's train section with the sizes below) trains on them; held-out prompts are decoded
by the evaluate stage's loop and proposer (``speculative_generate``, ``DFlashProposer``), the drafts being the logits'
argmax (unary path: a DFlash 2 drafter with its selector set aside) or, for DFlash 2, the candidate selector's path.
Reported per drafter, as the evaluate stage reports them (``draftline.evaluate.report``): tau (tokens per
verification step, the prefill's token in neither), greedy and sampled (the evaluate stage's ``sampled`` setting:
temperature 1, top-p 0.95, top-k 20, verified by rejection sampling; the selector's path drawn from its K-way
probabilities at the same temperature, which the rejection step divides by), and for DFlash 2 through its selector
the top-K oracle (``tau_top_k_oracle``: tokens per step, the target's own included, had every position drafted its
gold token whenever that token is among its top-K candidates, on the greedy run's own steps: the
selector's ceiling). (a) DFlash 1, (b) DFlash 2 from scratch, the same steps; (c) (a) trained ``--more`` steps
further as DFlash 1, and DFlash 2 warm-started from (a) for the same steps.

    python bench/dflash2_toy.py                       # 4 trainings per seed: ~3 minutes a seed on 2 busy cores
    python bench/dflash2_toy.py --steps 400 --more 200 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

VOCAB, HIDDEN, LAYERS, MASK = 256, 64, 6, 255
PROMPT, REPLY = 8, 40


def make_target(root: Path, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftline.core.records import TargetInfo

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512,
                         initializer_range=0.2)
    model = Qwen3ForCausalLM(config)
    teach(model, seed)
    model.eval().save_pretrained(root / "target-model")
    info = TargetInfo(path=str(root / "target-model"), tokenizer_fingerprint="toy", chat_template_sha256="toy",
                      eos_token="<eos>", eos_token_id=VOCAB - 2, pad_token_id=0, end_of_turn_token="<eos>",
                      end_of_turn_token_id=VOCAB - 2, think_start_token=None, think_end_token=None,
                      mask_token_id=MASK, vocab_size=VOCAB, num_hidden_layers=LAYERS, hidden_size=HIDDEN,
                      model_fingerprint="toy")
    path = root / "data" / "target" / "target.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict()))
    return model


def counting(n: int, generator: torch.Generator) -> torch.Tensor:
    """A learnable language: PROMPT random tokens, then counting up from a random start by a step of 1 to 3 (mod 200),
    the step and start to be read from the prompt's last two tokens."""
    prompt = torch.randint(1, 200, (n, PROMPT), generator=generator)
    step = torch.randint(1, 4, (n, 1), generator=generator)
    prompt[:, -1:] = 1 + (prompt[:, -2:-1] - 1 + step) % 200
    k = torch.arange(1, REPLY + 1)[None, :]
    reply = 1 + (prompt[:, -1:] - 1 + step * k) % 200
    return torch.cat([prompt, reply], dim=1)


def teach(model, seed: int, steps: int = 300) -> None:
    """A few hundred AdamW steps on :func:`counting`, so that the target's greedy replies follow a rule a drafter can
    learn (a random target's replies are close to noise, and every drafter then looks alike)."""
    g = torch.Generator().manual_seed(seed + 7)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids = counting(32, g)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


@torch.no_grad()
def greedy_rows(model, prompts: torch.Tensor) -> torch.Tensor:
    """The target's own greedy replies (REPLY tokens) to ``prompts`` [n, PROMPT]: prompt + reply ids."""
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=REPLY, do_sample=False,
                         min_new_tokens=REPLY, pad_token_id=0, eos_token_id=None)
    return out


def make_merged(root: Path, rows: torch.Tensor) -> None:
    from draftline.core import dataset as fmt

    n, length = rows.shape
    ids = rows.numpy().astype(np.int64)
    mask = np.zeros_like(ids, dtype=bool)
    mask[:, PROMPT:] = True
    offsets = np.arange(n + 1) * length
    table = fmt.build_table([f"r{i}" for i in range(n)], ["toy"] * n, offsets, ids.reshape(-1), mask.reshape(-1))
    meta = fmt.DatasetMeta(tokenizer_fingerprint="toy", chat_template_sha256="toy", enable_thinking=False,
                           max_len=length, mask_token_id=MASK, end_of_turn_token_id=VOCAB - 2)
    merged = root / "data" / "merged"
    fmt.write_dataset(merged, [table], meta)
    np.save(merged / fmt.ORDER_FILE, np.random.default_rng(1).permutation(n))


def train(root: Path, out: str, **overrides) -> dict:
    from draftline.core.runner import execute
    from draftline.train.params import DFlash2Params, TrainParams
    from draftline.train.stage import TrainArgs, run_train

    base = TrainParams.load("train", REPO / "params.yaml")
    d2 = overrides.pop("dflash2", {})
    p = replace(base, drafter_layers=2, target_layers=[1, 2, 4], block_size=8, gamma=4.0, anchors_per_seq=8,
                max_length=64, max_tokens_per_batch=1024, feature_cache_gb=1.0, lr=3e-3, threads=1, gpus=0,
                save_every=10_000, log_every=50, dflash2=replace(base.dflash2, **d2) if d2 else base.dflash2,
                **overrides)
    assert isinstance(p.dflash2, DFlash2Params)
    args = TrainArgs(merged=root / "data" / "merged", target=root / "data" / "target" / "target.json",
                     out=root / "ckpt" / out, metrics=root / "metrics" / f"{out}.json",
                     report=root / "reports" / f"{out}.json", plot=root / "plots" / f"{out}.csv",
                     drafters=root / "data" / "drafters")
    return execute("train", run_train, p, args).details


SAMPLED = dict(temperature=1.0, top_p=0.95, top_k=20)  # the evaluate stage's `sampled` setting (z-lab's cards')


def evaluate(root: Path, target, name: str, prompts: torch.Tensor, selector: bool) -> dict:
    """The evaluate stage's figures of the drafter ``root/ckpt/name`` on ``prompts``: tau greedy and sampled and, for
    a DFlash 2 drafter through its selector, the top-K oracle. ``selector`` False sets a DFlash 2 drafter's selector
    aside: the evaluate stage's proposer then drafts its logits, as it does a DFlash 1 drafter's (the unary path)."""
    from draftline.drafter.model import DFlashDrafter
    from draftline.drafter.speculative import GREEDY, DFlashProposer, Sampling
    from draftline.evaluate.report import figures, selector_figures

    drafter = DFlashDrafter.from_pretrained(root / "ckpt" / name, target)
    if not selector:
        drafter.candidate_selector = None
    proposer = DFlashProposer(drafter)
    greedy, sampled = (decode(target, proposer, prompts, s) for s in (GREEDY, Sampling(**SAMPLED)))
    out = {"tau": figures(greedy)["tau"], "tau_sampled": figures(sampled)["tau"]}
    oracle = selector_figures(greedy)
    if oracle:
        out["oracle_top_k"] = oracle["tau_top_k_oracle"]
    return out


def decode(target, proposer, prompts: torch.Tensor, sampling) -> list:
    """Each prompt decoded for REPLY tokens as the evaluate stage decodes a turn (the prompt's index its seed), with
    the selector's counts of a greedy turn where the proposer keeps its steps (DFlash 2 through its selector)."""
    from draftline.drafter.speculative import speculative_generate
    from draftline.evaluate.report import TurnResult, selector_counts

    setting = "greedy" if sampling.greedy else "sampled"
    results = []
    for i, p in enumerate(prompts.tolist()):
        gen = speculative_generate(target, proposer, p, REPLY, sampling=sampling, seed=i)
        counts = selector_counts(proposer.steps, p + gen.tokens) if sampling.greedy and proposer.steps else None
        results.append(TurnResult(setting, "held_out", "toy", str(i), 0, len(p), gen, None, counts))
    return results


def run(seed: int, steps: int, more: int, rows: int, evals: int) -> dict:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["DRAFTLINE_CACHE"] = str(root / "cache")
        target = make_target(root, seed)
        g = torch.Generator().manual_seed(seed + 100)
        rule = counting(rows + evals, g)
        prompts = rule[:, :PROMPT]
        data = greedy_rows(target, prompts[:rows])
        make_merged(root, data)
        held_out = prompts[rows:]
        # How far the target follows the rule it was taught (its replies are the data, whatever they are).
        table = {"target follows the rule": {"token_share": round(float((data == rule[:rows]).float().mean()), 3)}}
        train(root, "a_dflash", architecture="dflash", max_steps=steps)
        table["a: dflash"] = evaluate(root, target, "a_dflash", held_out, False)
        train(root, "b_dflash2", architecture="dflash2", max_steps=steps)
        table["b: dflash2 scratch (unary)"] = evaluate(root, target, "b_dflash2", held_out, False)
        table["b: dflash2 scratch (selector)"] = evaluate(root, target, "b_dflash2", held_out, True)
        # train.init_from is refused outside data/drafters (where DVC tracks it), so (a) is started from a copy there.
        start = str(shutil.copytree(root / "ckpt" / "a_dflash", root / "data" / "drafters" / "a_dflash"))
        train(root, "c_dflash_more", architecture="dflash", max_steps=more, init_from=start)
        table[f"c: dflash +{more}"] = evaluate(root, target, "c_dflash_more", held_out, False)
        train(root, "c_dflash2_warm", architecture="dflash2", max_steps=more, init_from=start)
        table[f"c: dflash2 warm +{more} (unary)"] = evaluate(root, target, "c_dflash2_warm", held_out, False)
        table[f"c: dflash2 warm +{more} (selector)"] = evaluate(root, target, "c_dflash2_warm", held_out, True)
        return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--more", type=int, default=300)
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--evals", type=int, default=16)
    a = ap.parse_args()
    for seed in a.seeds:
        table = run(seed, a.steps, a.more, a.rows, a.evals)
        print(f"seed {seed}:")
        for name, figures in table.items():
            print(f"  {name:36s} {json.dumps(figures)}")


if __name__ == "__main__":
    main()
