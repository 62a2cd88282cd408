"""The peers' trainers on draftline's own data: SGLang's SpecForge 0.2.0 (DFlash 1) and vLLM's speculators 0.9.0
(DFlash 1 and DFlash 2) beside draftline's trainer (DFlash 1 and 2), every drafter judged the same way (issue 32).

Per target seed (``--seeds``, a stand-in for another CPU's float arithmetic), in a git + DVC clone of this repository
(tests/project_clone.py: the shipped params but ``target.seed`` and ``export.formats: [specforge, speculators]``) after
``dvc repro``, it measures for every drafter:

- z-lab's acceptance (the mean over requests of each request's mean tokens per verification step) on the held-out
  prompts of one split (``--split``: test, the figures reported; dev, the one a decision reads), overall and per source, under every ``evaluate.sampling`` setting (greedy, and sampled at temperature 1),
  judged by draftline's evaluate stage (``stages/evaluate.py`` with the paths dvc.yaml gives it, outputs in the
  drafter's folder) and by z-lab's own loop (``dflash.model.dflash_generate`` of PyPI ``dflash`` 0.1.0) on the same
  prompts, rendered the same way;
- seconds per training step on one core (the mean interval between optimizer steps, recorded by bench/step_timer.py
  with a global optimizer-step hook, the same for every trainer) and the training process's wall time (for the
  peers without the hidden states, made once before, reported apart; for draftline with its in-memory feature pass);
- each drafter minus draftline's drafter of the same architecture, paired over the same requests: a seeded paired
  bootstrap (``draftline.core.intervals``, ``--resamples``, 95%) of the evaluate stage's per-step records,
  overall and per source; with several seeds, also pooled over the seeds, the interval resampling the seeds and
  then their requests (``compare_seeds``).

Invariants: every trainer reads the same rows (draftline's merged set, the peers draftline's own export of it), with
the same target layers, drafter shape (equal parameter counts), block size, steps, learning-rate schedule, seed and
objective weights as far as each can express them (the mapping below); every process runs one torch thread
(OMP/MKL/OPENBLAS/RAYON_NUM_THREADS=1, ``torch.set_num_threads(1)``) and one heavy job runs at a time; every drafter
is rewritten into z-lab's DFlash / DFlash 2 layout exactly as draftline's train stage writes it (config.json keys,
the ``draftline`` lineage block, weight names: checked against the clone's own checkpoints) and loaded by z-lab's
``dflash`` with no missing, unexpected or changed tensor before it is judged.

The peers, each in its own venv under ``<repo>/.draftline/peers/`` (ignored by git; reused while its pins match):
the torch of draftline's own venv (the CPU build, ``torch==2.13.0+cpu``, from the local wheel; a constraints file
keeps pip from pulling another), the peer ``--no-deps`` (SpecForge pins torch 2.11, transformers 5.8.1 and sglang;
speculators pins torchvision, torchaudio and hs-connectors) and then only what they import (their own version
bounds kept). Their hidden states are made with HF transformers on the CPU from the clone's target
(``data/target/model``) in the files their GPU paths write:

- speculators: ``hidden_states/hs_<row>.safetensors`` as ``speculators generate-offline-data`` saves vLLM's
  ExampleHiddenStatesConnector output: ``token_ids`` [n] and ``hidden_states`` [n, layers + 1, hidden], the aux
  layers by vLLM's ids (z-lab's id + 1, ``convert/dflash/converter.py``) and last the final layer's output before the
  final norm (speculators applies the verifier's norm and lm_head itself); read by ``--hidden-states-path``;
- SpecForge: ``rows_<g>-<g+2000>/data_<row>.ckpt`` as ``scripts/prepare_hidden_states.py --strategy dflash`` saves
  them (its ``OfflineCaptureLayout``): ``input_ids``, ``loss_mask`` [n] and ``hidden_states`` [1, n, layers x hidden],
  each layer's output (SGLang's ``set_dflash_layers_to_capture``: z-lab's id + 1), for ``data.hidden_states_path``
  (SpecForge 0.2.0 removed its in-process HF target: offline files are its only path without an SGLang server).

Patches, applied by the bench to the venv's installed copy (each replaced text must be found exactly once; a
changed patch list rebuilds the venv), and why; nothing else of either peer is changed, and none touches the training
math:

- speculators ``train/trainer.py``: ``self.local_rank = get_local_rank()`` becomes ``"cpu"`` when torch has no
  accelerator: the trainer moves the model and every batch to ``local_rank``, an accelerator index;
- speculators ``train/trainer.py``: ``torch.accelerator.synchronize()`` in ``_StepTimer.mark`` and ``.now`` only when
  an accelerator exists: it raises without one, on every logged step;
- speculators ``train/trainer.py``: ``run_training`` stops at ``--max-steps``: ``train_epoch`` breaks at max_steps but
  the epoch loop goes on, and each further epoch trains one more step (30 steps asked, 32 trained over 3 epochs);
- SpecForge: none. It runs on the CPU with its own settings: ``training.fsdp_sharding: NO_SHARD`` (DDP over gloo;
  FSDP needs an accelerator), ``training.attention_backend: sdpa`` (its dense mask; flex attention compiles for GPUs),
  ``model.torch_dtype: float32``, ``data.dataloader_num_workers: 0``. speculators likewise takes
  ``--draft-attn-impl sdpa`` (its option "for hardware that doesn't support flex attention"), ``--loss-implementation
  eager`` (the fused losses are Triton kernels), ``--hidden-states-dtype float32``, ``--num-workers 0``;
- z-lab's ``dflash`` 0.1.0, the referee, in this process only while its loop runs (:func:`short_block_convolve`): its
  DFlash 2 convolution crashes on a block shorter than its kernel (a reply's last step with 2 or 3 tokens left); such
  a block is zero-padded at its end and cut back, which leaves every output as z-lab computes it.

speculators' labels are the target's own logits at each position (``--speculators-loss``: ``ce``, the default here,
trains on their argmax; ``kl_div``, its own DFlash 2 default, on the whole distribution; each loss is a pair of
drafters of its own).

Settings are read from the clone's ``params.yaml`` ``train`` section (:func:`read_settings`), never written here:
drafter_layers, block_size, target_layers, lr, warmup_ratio, min_lr_ratio, adam_betas, weight_decay, grad_clip,
max_steps, gamma, max_length, seed, anchors_per_seq, max_tokens_per_batch, log_every, sliding_window /
max_window_layers and the ``dflash2`` block; rows per step where a peer counts rows (SpecForge's ``batch_size``) are
the token budget over the mean row length, and speculators' anchors per 1,024-token pack are ``anchors_per_seq`` x
rows per pack. What cannot be matched is printed (:func:`unmatched`). draftline's own drafters are trained by its
train stage in the clone (``stages/train.py`` with dvc.yaml's paths, a params file given by ``DRAFTLINE_PARAMS``, a
fresh ``DRAFTLINE_CACHE``), one per ``--draftline-variant NAME:key=value,...`` (default ``dflash:train.architecture=
dflash`` and ``dflash2:train.architecture=dflash2``; keys without a section are ``train.`` keys).

Every drafter's folder (``<clone>/.draftline/peers/drafters/<name>/``) keeps its checkpoint, logs and a result.json
keyed by what made it and by what judged it: a rerun on a kept clone (``--keep``/``--project``) retrains and
rejudges only what changed (``--retrain`` redoes them all), so iterating costs neither a repro nor a retraining;
``--steps N`` (a smoke test) trains N steps into folders of its own. ``--equal-time PEER_DRAFTER ...`` adds, per peer
drafter named, draftline's drafter of its architecture trained for the steps that take that peer's time from the
export to its drafter in this run (its hidden states' forward and files, then its training process; draftline's wall
holds its own features pass), from the draftline drafter's own start-up and s/step, rounded down to 100 steps
(``NAME=STEPS``: steps fitted on another seed's run), judged against the peer: equal wall time holds only where both
ran under the same load (a quiet machine, one core each). ``--pool OUT_JSON ...`` prints the tables of several runs'
``--out`` files, pooled; ``--pair A~B`` adds A minus B for any two drafters (e.g. a variant minus a peer).

    python bench/peers.py                                           # seed 0: ~8 min repro + ~25 min on 2 cores
    python bench/peers.py --seeds 0 1 2 --keep '/work/peers-seed{seed}' --out peers.json
    python bench/peers.py --project /work/peers-seed0 --trainers draftline \
        --draftline-variant big:max_tokens_per_batch=4096                 # a variant beside the peers' kept results
    python bench/peers.py --project /work/peers-seed0 --trainers draftline speculators --skip speculators-dflash \
        --draftline-variant a16:anchors_per_seq=16 --peer-variant a16:anchors_per_seq=16  # one change for both
"""

from __future__ import annotations

import sys
from pathlib import Path

# The temporary-clone helpers are the pipeline test's.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch
import yaml
from project_clone import make_project, run

REPO = Path(__file__).resolve().parents[1]
TIMER = Path(__file__).resolve().with_name("step_timer.py")
VENVS = REPO / ".draftline" / "peers"
# The peers get the torch of draftline's own venv (scripts/install.sh: the CPU build, 2.13.0+cpu from the local wheel):
# never another build (an unpinned `torch` requirement pulls a 5.5 GB CUDA one).
TORCH = f"torch=={torch.__version__}"
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
DEFAULT_VARIANTS = ("dflash:train.architecture=dflash", "dflash2:train.architecture=dflash2")
TRAINERS = ("draftline", "specforge", "speculators")


# -- the peers' environments ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Patch:
    file: str  # relative to the venv's site-packages
    old: str
    new: str
    reason: str


@dataclass(frozen=True)
class Peer:
    name: str
    packages: tuple[str, ...]  # installed --no-deps
    deps: tuple[str, ...]  # what they import, within their own pins
    patches: tuple[Patch, ...] = ()


_TRAINER = "speculators/train/trainer.py"
SPECULATORS = Peer(
    "speculators", ("speculators==0.9.0", "hs-connectors==0.9.0"),
    ("transformers>=5.0,<=5.19.0", "datasets>=4.0,<=5.1.0", "loguru>=0.7.2,<=0.7.3", "numpy>=2.0,<=2.5.4",
     "tqdm>=4.66.3,<=4.70.1", "pydantic", "pydantic-settings", "safetensors", "rich", "typer", "openai", "httpx",
     "aiohttp", "click", "psutil", "pyyaml"),
    (Patch(_TRAINER, "        self.local_rank = get_local_rank()\n",
           "        self.local_rank = get_local_rank() if torch.accelerator.is_available() else \"cpu\"\n",
           "the model and every batch go to local_rank, an accelerator index: the CPU when there is none"),
     Patch(_TRAINER, "            torch.accelerator.synchronize()\n            self._marks[name]",
           "            if torch.accelerator.is_available():\n                torch.accelerator.synchronize()\n"
           "            self._marks[name]",
           "_StepTimer.mark synchronizes an accelerator on every logged step: it raises without one"),
     Patch(_TRAINER, "        torch.accelerator.synchronize()\n        return time.perf_counter()",
           "        if torch.accelerator.is_available():\n            torch.accelerator.synchronize()\n"
           "        return time.perf_counter()",
           "_StepTimer.now, the same"),
     Patch(_TRAINER, "        for epoch in range(self.current_epoch, n_epochs):\n",
           "        for epoch in range(self.current_epoch, n_epochs):\n"
           "            if self.config.max_steps is not None and self.global_step >= self.config.max_steps:\n"
           "                break\n",
           "train_epoch stops at --max-steps but run_training starts the next epoch, which trains one more step")),
)
SPECFORGE = Peer(
    "specforge", ("specforge==0.2.0",),
    ("transformers==5.8.1", "datasets", "accelerate", "huggingface-hub", "numpy", "pydantic", "psutil", "pyyaml",
     "safetensors", "requests", "tqdm", "typing-extensions"),
)
PEERS = {p.name: p for p in (SPECULATORS, SPECFORGE)}


def venv_python(peer: Peer) -> Path:
    """The peer's venv (made, or reused while its pins and patches are the same), patched; its python."""
    venv = VENVS / f"venv-{peer.name}"
    VENVS.mkdir(parents=True, exist_ok=True)
    # Runs of several seeds side by side share the venvs: one builds or patches while the others wait for it.
    with open(VENVS / f"venv-{peer.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_venv(peer, venv)
        apply_patches(venv, peer.patches)
    return venv / "bin" / "python"


def _build_venv(peer: Peer, venv: Path) -> None:
    """Make the venv unless its stamp, written last, records the same pins: a half-built one is built again."""
    stamp = venv / "draftline-pins.json"
    want = json.loads(json.dumps({**asdict(peer), "torch": TORCH, "python": sys.version.split()[0]}))
    if not (stamp.is_file() and json.loads(stamp.read_text()) == want):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        constraints = venv / "constraints.txt"
        constraints.write_text(f"{TORCH}\n")  # no dependency may pull another torch
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints)]
        for args in ([TORCH], ["--no-deps", *peer.packages], list(peer.deps)):
            p = subprocess.run([*pip, *args], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"pip install {' '.join(args)} failed in {venv}:\n{p.stdout[-2000:]}"
                                   f"{p.stderr[-3000:]}")
        stamp.write_text(json.dumps(want))


def apply_patches(venv: Path, patches: tuple[Patch, ...]) -> None:
    """Each patch applied once (already applied: left alone; the text to replace not found exactly once: refused)."""
    site = next(venv.glob("lib/python*/site-packages"))
    for p in patches:
        path = site / p.file
        text = path.read_text(encoding="utf-8")
        if p.new in text:
            continue
        if text.count(p.old) != 1:
            raise RuntimeError(f"{path}: the code patch '{p.reason}' replaces is not there exactly once")
        path.write_text(text.replace(p.old, p.new), encoding="utf-8")


# -- the clone -----------------------------------------------------------------------------------------------------

def clone_env(root: Path) -> dict[str, str]:
    """The environment a clone's stages run in (as tests/project_clone.make_project makes it), one thread."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(PYTHONPATH=str(root / "src"), DRAFTLINE_CACHE=str(root / ".draftline" / "cache"), **THREADS)
    return env


def finished(root: Path, seed: int) -> bool:
    """A clone whose repro is complete, with the exports, for this target seed."""
    if not (root / "dvc.lock").is_file() or not (root / "data" / "checkpoints" / "config.json").is_file():
        return False
    params = yaml.safe_load((root / "params.yaml").read_text())
    return (params["target"]["seed"] == seed and {"specforge", "speculators"} <= set(params["export"]["formats"])
            and (root / "data/export/specforge/train.jsonl").is_file()
            and (root / "data/export/speculators/dataset_info.json").is_file())


def prepare_clone(seed: int, keep: str | None, project: Path | None) -> tuple[Path, float | None]:
    """The seed's clone after ``dvc repro`` (``--project``: as given; ``--keep``: there, reused when finished; else a
    temporary folder) and the repro's wall seconds (None when reused)."""
    if project is not None:
        if not finished(project, seed):
            raise SystemExit(f"{project} is not a finished clone of target seed {seed} with both exports")
        return project, None
    root = Path(keep.format(seed=seed) if "{seed}" in keep else Path(keep) / f"seed{seed}") if keep else \
        Path(tempfile.mkdtemp(prefix=f"peers-seed{seed}-"))
    if finished(root, seed):
        return root, None
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise SystemExit(f"{root} exists and is not a finished clone: remove it or name another --keep")
    env = make_project(root, {"target": {"seed": seed}, "export": {"formats": ["specforge", "speculators"]}})
    t0 = time.perf_counter()
    run(["dvc", "repro"], root, {**env, **THREADS}, timeout=7200)
    return root, time.perf_counter() - t0


def stage_command(root: Path, stage: str, dest: Path, inputs: dict[str, str]) -> list[str]:
    """``stage``'s command from the clone's dvc.yaml, its outputs moved into ``dest`` (``metrics/train.json`` ->
    ``dest/metrics_train.json``) and the inputs named in ``inputs`` replaced."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())
    paths = {k: v for var in spec["vars"] for k, v in var.get("paths", {}).items()}

    def render(text: str) -> str:
        return re.sub(r"\$\{paths\.(\w+)\}", lambda m: paths[m[1]], text)

    body = spec["stages"][stage]
    outs = {render(next(iter(o)) if isinstance(o, dict) else o)
            for kind in ("outs", "metrics", "plots") for o in body.get(kind, [])}
    moved = {o: str(dest / o.replace("/", "_")) for o in outs}
    tokens = shlex.split(render(body["cmd"]))
    return [moved.get(t, inputs.get(t, t)) for t in tokens]


# -- what params.yaml says, and what each trainer can take of it ---------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The clone's ``train`` section as the trainers need it, with the data's shape."""

    layers: int
    block_size: int
    target_layers: list[int]  # z-lab's ids (layer i's output is hidden_states[i + 1])
    mask_token_id: int
    lr: float
    warmup_ratio: float
    min_lr_ratio: float
    adam_betas: list[float]
    labels: Any  # train.labels as the clone's params.yaml has it (a label name, or weights of several)
    weight_decay: float
    grad_clip: float
    max_steps: int
    gamma: float
    max_length: int
    seed: int
    anchors_per_seq: int
    max_tokens_per_batch: int
    log_every: int
    sliding_window: int | None
    max_window_layers: int
    dflash2: dict[str, Any]
    rows: int
    mean_row_tokens: float
    target_layers_total: int
    lineage: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_step(self) -> int:
        """Rows a draftline step holds on average: its token budget over the mean row."""
        return max(1, round(self.max_tokens_per_batch / self.mean_row_tokens))

    @property
    def anchors_per_pack(self) -> int:
        return max(1, round(self.anchors_per_seq * self.max_tokens_per_batch / self.mean_row_tokens))


LINEAGE_KEYS = ("chat_template_sha256", "enable_thinking", "mask_token_id", "tokenizer_fingerprint")


def read_settings(root: Path, max_steps: int | None = None) -> Settings:
    """The clone's train section (``max_steps``: instead of its own, a smoke test) and the export's shape."""
    from draftline.drafter.config import build_target_layer_ids

    t = yaml.safe_load((root / "params.yaml").read_text())["train"]
    t["max_steps"] = max_steps or t["max_steps"]
    target = json.loads((root / "data/target/target.json").read_text())
    source = json.loads((root / "data/export/export.json").read_text())["source"]
    n = int(target["num_hidden_layers"])
    layers = t["target_layers"]
    layers = layers if isinstance(layers, list) else build_target_layer_ids(n, layers)
    return Settings(
        layers=t["drafter_layers"], block_size=t["block_size"], target_layers=[int(i) for i in layers],
        mask_token_id=int(target["mask_token_id"]), lr=t["lr"], warmup_ratio=t["warmup_ratio"],
        min_lr_ratio=t["min_lr_ratio"], adam_betas=list(t["adam_betas"]), weight_decay=t["weight_decay"],
        grad_clip=t["grad_clip"], max_steps=t["max_steps"], gamma=t["gamma"], max_length=t["max_length"],
        seed=t["seed"], anchors_per_seq=t["anchors_per_seq"], max_tokens_per_batch=t["max_tokens_per_batch"],
        log_every=t["log_every"], sliding_window=t["sliding_window"], max_window_layers=t["max_window_layers"],
        dflash2=dict(t["dflash2"]), labels=t.get("labels", "data"), rows=int(source["num_rows"]),
        mean_row_tokens=source["num_tokens"] / source["num_rows"], target_layers_total=n,
        lineage={k: source[k] for k in LINEAGE_KEYS})


def unmatched(s: Settings, losses: list[str]) -> list[str]:
    """What the peers cannot be given as draftline's params say (printed with every run)."""
    out = [
        f"AdamW betas: both peers use torch's default (0.9, 0.999); draftline {tuple(s.adam_betas)} (no setting in "
        "either)",
        f"batches: draftline packs shuffled rows first fit into {s.max_tokens_per_batch}-token packs (one a step, "
        f"each row attending to itself alone); SpecForge takes batch_size {s.rows_per_step} rows (budget / mean "
        f"row of {s.mean_row_tokens:.0f} tokens), shuffled each epoch, padded to the longest (drop_last); speculators "
        f"packs shuffled rows into {s.max_tokens_per_batch}-token sequences (one pack a step)",
        f"anchors: draftline and SpecForge {s.anchors_per_seq} a row; speculators {s.anchors_per_pack} a pack "
        "(its max_anchors is per packed sequence)",
        f"labels: draftline train.labels {s.labels}; SpecForge the data's next token; speculators the target's own "
        f"logits at each position (--loss-fn {', '.join(losses)}: ce takes their argmax, kl_div the whole "
        "distribution); the loss is normalised by the decay-weighted supervised positions (draftline, SpecForge) or "
        "by their count (speculators)",
        "validation: speculators needs train_data_ratio < 1, so one row is held out of its training",
        "checkpoint dtype: speculators saves its weights in bf16 whatever it trained in; the others in float32",
        "seeds: each trainer's own random streams (initialisation, order, anchors) from the same seed value",
    ]
    if s.min_lr_ratio:
        out.append(f"min_lr_ratio {s.min_lr_ratio}: both peers' cosine decays to 0")
    if s.weight_decay:
        out.append(f"weight_decay {s.weight_decay}: SpecForge has no setting (its AdamW's is 0)")
    if s.grad_clip != 1.0:
        out.append(f"grad_clip {s.grad_clip}: speculators clips at 1.0 (hard-coded)")
    if s.max_length != s.max_tokens_per_batch:
        out.append(f"max_length {s.max_length}: speculators' total_seq_len is both the pack size and the cut")
    out.append(f"DFlash 2 selector: draftline warms its weight up over selector_warmup_ratio "
               f"{s.dflash2.get('selector_warmup_ratio')} with labels '{s.dflash2.get('selector_labels')}' and "
               f"gold_outside_top_k '{s.dflash2.get('gold_outside_top_k')}'; speculators: full weight from step 1, "
               "the target's argmax, a gold outside the top K inserted at rank K")
    return out


# -- the peers' hidden states --------------------------------------------------------------------------------------

def write_features(root: Path, work: Path, s: Settings) -> dict[str, Any]:
    """Both peers' offline hidden-state files from one CPU forward of the clone's target per row (reused while the
    target and the exports are unchanged), and each peer's seconds for them: the forwards (and the model's load) plus
    its own files' writes, what its GPU server's pass stands for (draftline's train stage makes the same features in
    memory, inside its wall)."""
    stamp = work / "features.json"
    key = digest({"target": json.loads((root / "data/target/target.json").read_text()),
                  "export": json.loads((root / "data/export/export.json").read_text()), "layers": s.target_layers})
    old = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if old.get("key") == key and "peer_s" in old:  # a stamp without per-peer seconds predates them: write again
        return old
    from datasets import load_from_disk

    for peer in PEERS:
        shutil.rmtree(work / peer, ignore_errors=True)
    t0 = time.perf_counter()
    clock = {"forward": 0.0, **{peer: 0.0 for peer in PEERS}}

    def timed_call(name: str, fn, *a):
        t = time.perf_counter()
        out = fn(*a)
        clock[name] += time.perf_counter() - t
        return out

    capture = timed_call("forward", Capture, root / "data/target/model", s.target_layers)
    rows = load_from_disk(str(root / "data/export/speculators")).with_format("torch")
    with open(root / "data/export/specforge/train.jsonl", encoding="utf-8") as f:
        lines = f.readlines()
    if len(lines) != len(rows):
        raise RuntimeError(f"the exports disagree: {len(lines)} SpecForge rows, {len(rows)} speculators rows")
    for i, (row, line) in enumerate(zip(rows, lines)):
        ids = row["input_ids"].long()
        aux, last = timed_call("forward", capture, ids)
        timed_call("speculators", save_speculators, work / "speculators" / "hidden_states", i, ids, aux, last)
        record = json.loads(line)
        sf_ids = torch.tensor(record["input_ids"], dtype=torch.long)
        if not torch.equal(sf_ids, ids):  # the same rows in the same order: one forward serves both
            aux, _ = timed_call("specforge", capture, sf_ids)
        timed_call("specforge", save_specforge, work / "specforge" / "hidden_states", i, sf_ids, record["loss_mask"],
                   aux)
    out = {"key": key, "rows": len(rows), "seconds": round(time.perf_counter() - t0, 1),
           "peer_s": {peer: round(clock["forward"] + clock[peer], 1) for peer in PEERS}}
    stamp.write_text(json.dumps(out))
    return out


def save_speculators(folder: Path, i: int, ids: torch.Tensor, aux: list[torch.Tensor], last: torch.Tensor) -> None:
    """``hs_<i>.safetensors`` as vLLM's hidden-states connector writes it and speculators' FileTransfer reads it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"hidden_states": torch.stack([*aux, last], dim=1).contiguous(), "token_ids": ids},
              str(folder / f"hs_{i}.safetensors"))


def save_specforge(folder: Path, i: int, ids: torch.Tensor, loss_mask: list[int], aux: list[torch.Tensor]) -> None:
    """``rows_<g>-<g+2000>/data_<i>.ckpt`` as SpecForge's prepare_hidden_states.py writes a DFlash record."""
    group = folder / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"
    group.mkdir(parents=True, exist_ok=True)
    torch.save({"input_ids": ids, "loss_mask": torch.tensor(loss_mask, dtype=torch.long),
                "hidden_states": torch.cat(aux, dim=-1)[None].contiguous()}, group / f"data_{i}.ckpt")


class Capture:
    """The target's hidden states of one row: each chosen layer's output (``hidden_states[i + 1]``) and the last
    layer's output before the final norm (``hidden_states[-1]`` is after it, so a hook on the last layer)."""

    def __init__(self, model_dir: Path, layer_ids: list[int]):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", local_files_only=True).eval()
        self.layer_ids, self._last = layer_ids, None
        self.model.model.layers[-1].register_forward_hook(self._keep)

    def _keep(self, _module, _inputs, output) -> None:
        self._last = output[0] if isinstance(output, tuple) else output

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        out = self.model(ids[None], output_hidden_states=True)
        return [out.hidden_states[i + 1][0] for i in self.layer_ids], self._last[0]


# -- training ------------------------------------------------------------------------------------------------------

def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def timed(cmd: list[str], cwd: Path, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """Run a trainer under bench/step_timer.py (``cmd`` is what follows ``python``); its steps, time per step and
    wall seconds. Its output goes to ``folder/train.log``."""
    times = folder / "steps.json"
    log = folder / "train.log"
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        p = subprocess.run([cmd[0], str(TIMER), str(times), *cmd[1:]], cwd=cwd, env={**env, **THREADS}, stdout=f,
                           stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}); the end of {log}:\n{tail}")
    t = json.loads(times.read_text())
    return {"steps": t["steps"], "s_per_step": (t["last"] - t["first"]) / max(1, t["steps"] - 1),
            "median_step_s": t["deltas_median"], "wall_s": round(wall, 1)}


def speculators_args(arch: str, root: Path, features: Path, s: Settings, loss_fn: str, save: Path) -> list[str]:
    full = range(s.layers) if s.sliding_window is None else range(min(s.layers, s.max_window_layers))
    args = [
        "--speculator-type", arch, "--verifier-name-or-path", str(root / "data/target/model"),
        "--data-path", str(root / "data/export/speculators"), "--hidden-states-path", str(features),
        "--on-missing", "raise", "--total-seq-len", str(s.max_tokens_per_batch),
        "--train-data-ratio", str((s.rows - 0.5) / s.rows), "--hidden-states-dtype", "float32",
        "--num-workers", "0", "--max-anchors", str(s.anchors_per_pack), "--block-size", str(s.block_size),
        "--num-layers", str(s.layers), "--target-layer-ids", *[str(i + 1) for i in s.target_layers],
        "--mask-token-id", str(s.mask_token_id), "--lr", str(s.lr), "--optimizer", "adamw",
        "--weight-decay", str(s.weight_decay), "--scheduler-type", "cosine",
        "--scheduler-warmup-ratio", str(s.warmup_ratio), "--max-steps", str(s.max_steps),
        "--epochs", str(s.max_steps), "--dflash-decay-gamma", str(s.gamma),
        "--per-position-loss-weight", "fixed-exp-decay", "--loss-fn", loss_fn, "--loss-implementation", "eager",
        "--draft-attn-impl", "sdpa", "--full-attention-indices", *[str(i) for i in full], "--seed", str(s.seed),
        "--save-path", str(save), "--log-freq", str(s.log_every), "--log-dir", str(save.parent / "logs"),
    ]
    if s.sliding_window is not None:
        args += ["--sliding-window", str(s.sliding_window)]
    if arch == "dflash2":
        d = s.dflash2
        args += ["--conv-kernel-size", str(d["conv_kernel_size"]), "--conv-group-size", str(d["conv_group_size"]),
                 "--selector-rank", str(d["selector_rank"]), "--selector-top-k", str(d["selector_top_k"]),
                 "--selector-loss-alpha", str(d["selector_loss_weight"])]
    return args


def train_speculators(arch: str, root: Path, work: Path, s: Settings, loss_fn: str, folder: Path
                      ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    python = venv_python(SPECULATORS)
    save = folder / "run"
    shutil.rmtree(save, ignore_errors=True)
    args = speculators_args(arch, root, work / "speculators" / "hidden_states", s, loss_fn, save)
    stats = timed([str(python), "-m", "speculators", "train", *args], folder, clone_env(root), folder)
    last = max((d for d in save.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
    stats["global_step"] = json.loads((last / "training_state.json").read_text())["global_step"]
    return stats, load_file(str(last / "model.safetensors"))


def specforge_config(root: Path, work: Path, s: Settings, folder: Path) -> dict[str, Any]:
    draft = folder / "draft_config.json"
    draft.write_text(json.dumps(zlab_config(root, s, "dflash"), indent=2))
    batches = s.rows // s.rows_per_step
    return {
        "model": {"target_model_path": str(root / "data/target/model"), "draft_model_config": str(draft),
                  "torch_dtype": "float32", "mask_token_id": s.mask_token_id},
        "data": {"hidden_states_path": str(work / "specforge" / "hidden_states"), "max_length": s.max_length,
                 "dataloader_num_workers": 0, "cache_dir": str(folder / "cache")},
        "training": {"strategy": "dflash", "num_epochs": math.ceil(s.max_steps / batches) + 1,
                     "max_steps": s.max_steps, "batch_size": s.rows_per_step, "learning_rate": s.lr,
                     "lr_scheduler": "cosine", "warmup_ratio": s.warmup_ratio, "max_grad_norm": s.grad_clip,
                     "attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD", "num_anchors": s.anchors_per_seq,
                     "loss_decay_gamma": s.gamma, "loss_type": "dflash", "seed": s.seed,
                     "log_interval": s.log_every},
        "output_dir": str(folder / "output"), "run_id": "peers",
    }


def train_specforge(root: Path, work: Path, s: Settings, folder: Path
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``specforge train`` on the offline files, then its own ``specforge export --to hf`` of the last state."""
    from safetensors.torch import load_file

    python = venv_python(SPECFORGE)
    shutil.rmtree(folder / "output", ignore_errors=True)
    config = folder / "run.yaml"
    config.write_text(yaml.safe_dump(specforge_config(root, work, s, folder), sort_keys=False))
    env = clone_env(root)
    stats = timed([str(python), "-m", "specforge.cli", "train", "-c", str(config)], folder, env, folder)
    state = torch.load(folder / "output" / "peers-latest" / "training_state.pt", map_location="cpu",
                       weights_only=False)
    stats["global_step"] = int(state["global_step"])
    shutil.rmtree(folder / "hf", ignore_errors=True)
    subprocess.run([str(python), "-m", "specforge.cli", "export", "--to", "hf", "--checkpoint",
                    str(folder / "output" / "peers-latest"), "--draft-config", str(folder / "draft_config.json"),
                    "--output-dir", str(folder / "hf")], cwd=folder, env=env, check=True, capture_output=True)
    return stats, load_file(str(folder / "hf" / "model.safetensors"))


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]


def parse_variant(text: str) -> Variant:
    """``NAME:key=value,key=value`` (commas inside [] or {} belong to the value; values are YAML; a key without a
    section is a ``train.`` key)."""
    name, _, body = text.partition(":")
    parts, depth, current = [], 0, ""
    for ch in body:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    overrides = {}
    for part in filter(None, (p.strip() for p in parts)):
        key, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"--draftline-variant {text!r}: expected NAME:key=value,key=value")
        overrides[key if "." in key else f"train.{key}"] = yaml.safe_load(value)
    return Variant(name, overrides)


def variant_params(root: Path, variant: Variant) -> dict[str, Any]:
    params = yaml.safe_load((root / "params.yaml").read_text())
    for dotted, value in variant.overrides.items():
        node, *keys = dotted.split(".")
        where = params[node]
        for k in keys[:-1]:
            where = where[k]
        if keys[-1] not in where:
            raise SystemExit(f"--draftline-variant {variant.name}: params.yaml has no {dotted}")
        where[keys[-1]] = value
    return params


def train_draftline(variant: Variant, root: Path, folder: Path) -> tuple[dict[str, Any], Path]:
    """draftline's train stage in the clone, with the variant's params file and a fresh resumable-state cache."""
    (folder / "params.yaml").write_text(yaml.safe_dump(variant_params(root, variant), sort_keys=False))
    out = folder / "stage"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    cmd = stage_command(root, "train", out, {})
    env = {**clone_env(root), "DRAFTLINE_PARAMS": str(folder / "params.yaml"), "DRAFTLINE_CACHE": str(folder / "cache")}
    shutil.rmtree(folder / "cache", ignore_errors=True)
    stats = timed([sys.executable, *cmd[1:]], root, env, folder)
    shutil.rmtree(folder / "cache", ignore_errors=True)
    report = json.loads(Path(out / "reports_train.json").read_text())
    stats["global_step"] = report["steps"]
    return stats, out / "data_checkpoints"


# -- z-lab's layout ------------------------------------------------------------------------------------------------

def drafter_config(root: Path, s: Settings, arch: str):
    """The drafter's config as draftline's train stage makes it (``make_config``: the target's shapes, z-lab's
    ``dflash_config``, the export's lineage)."""
    from transformers import AutoConfig

    from draftline.drafter.config import make_config

    window = {} if s.sliding_window is None else {"sliding_window": s.sliding_window,
                                                  "max_window_layers": s.max_window_layers}
    return make_config(AutoConfig.from_pretrained(root / "data/target/model"), num_layers=s.layers,
                       block_size=s.block_size, mask_token_id=s.mask_token_id, target_layer_ids=s.target_layers,
                       lineage=s.lineage, architecture=arch, dflash2=s.dflash2 if arch == "dflash2" else None,
                       **window)


def zlab_config(root: Path, s: Settings, arch: str) -> dict[str, Any]:
    """config.json of a drafter in z-lab's layout, as draftline's train stage writes it."""
    from draftline.drafter.checkpoint import checkpoint_config

    return checkpoint_config(drafter_config(root, s, arch), torch.float32)


def to_zlab(weights: dict[str, torch.Tensor], root: Path, s: Settings, arch: str, dest: Path) -> Path:
    """A peer's weights (z-lab's names in both peers) as a drafter checkpoint in z-lab's layout, saved by draftline's
    ``DFlashDrafter.save_pretrained`` in float32 (the embedded target's dtype); every tensor must be used (strict)."""
    from draftline.drafter.model import DFlashDrafter

    shutil.rmtree(dest, ignore_errors=True)
    drafter = DFlashDrafter(drafter_config(root, s, arch))
    drafter.load_state_dict({k.removeprefix("model."): v.float() for k, v in weights.items()}, strict=True)
    drafter.save_pretrained(dest, dtype=torch.float32)
    return dest


def check_zlab(checkpoint: Path, weights: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """z-lab's ``dflash`` loads the checkpoint with no missing, unexpected or mismatched tensor, and (for a peer's
    drafter) holds exactly the peer's weights (in the checkpoint's dtype)."""
    import dflash.model as zlab

    arch = json.loads((checkpoint / "config.json").read_text())["architectures"][0]
    model, info = getattr(zlab, arch).from_pretrained(str(checkpoint), dtype=torch.float32,
                                                      output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise RuntimeError(f"z-lab's dflash loads {checkpoint} with {problems}")
    theirs = model.state_dict()
    for name, tensor in (weights or {}).items():
        zname = name + ".weight" if name.endswith("codebook") else name
        if not torch.equal(theirs[zname], tensor.to(torch.float32)):
            raise RuntimeError(f"{checkpoint}: z-lab's {zname} is not the trainer's {name}")
    return {"class": arch, "tensors": len(theirs), "parameters": sum(t.numel() for t in theirs.values())}


def check_layout(checkpoint: Path, reference: Path) -> None:
    """The same config.json keys, ``draftline`` lineage block and weight names as a checkpoint of draftline's train
    stage of the same architecture."""
    from safetensors import safe_open

    mine, ref = (json.loads((p / "config.json").read_text()) for p in (checkpoint, reference))
    names = [set(safe_open(str(p / "model.safetensors"), "pt").keys()) for p in (checkpoint, reference)]
    if set(mine) ^ set(ref) or mine["draftline"] != ref["draftline"] or names[0] != names[1]:
        raise RuntimeError(f"{checkpoint} is not in the layout of draftline's {reference}: keys "
                           f"{sorted(set(mine) ^ set(ref))}, tensors {sorted(names[0] ^ names[1])[:5]}")


# -- judging -------------------------------------------------------------------------------------------------------

def evaluate(root: Path, checkpoint: Path, folder: Path, split: str) -> dict[str, Any]:
    """draftline's evaluate stage on ``checkpoint`` (the clone's params and sets, the prompts of ``split`` only: a
    request's draws depend on its own id alone, so its figures are those of a run over every split), outputs
    in ``folder``."""
    from draftline.core.splits import split_of

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prompts = folder / "prompts.jsonl"
    with open(root / "data/prompts/eval.jsonl", encoding="utf-8") as f:
        prompts.write_text("".join(line for line in f if split_of(json.loads(line)["id"]) == split), encoding="utf-8")
    cmd = stage_command(root, "evaluate", folder, {"data/checkpoints": str(checkpoint),
                                                   "data/prompts/eval.jsonl": str(prompts)})
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *cmd[1:]], cwd=root, env=clone_env(root), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"evaluate failed on {checkpoint}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    from draftline.core.intervals import request_acceptance

    report = json.loads((folder / "reports_eval.json").read_text())
    with open(folder / "plots_eval_steps.jsonl", encoding="utf-8") as f:
        steps = [json.loads(line) for line in f]
    out: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 1)}
    for name, st in report["splits"][split].items():
        out[name] = {"acceptance": st["per_set"]["heldout"]["acceptance"], "tau": st["per_set"]["heldout"]["tau"],
                     "per_source": {k: v["acceptance"] for k, v in st["per_source"].items()},
                     "per_set": {k: v["acceptance"] for k, v in st["per_set"].items()}, "lossless": st.get("lossless"),
                     "requests": request_acceptance(steps, name, split=split)}
    return out


def zlab_loop(root: Path, checkpoint: Path, split: str) -> dict[str, Any]:
    """z-lab's ``dflash_generate`` (unchanged; its CUDA clock swapped for the CPU's) on the held-out prompts, every
    ``evaluate.sampling`` setting, each turn seeded as the evaluate stage seeds it: per-request acceptance."""
    import dflash.model as zlab

    from draftline.core.records import read_prompts
    from draftline.core.requests import heldout_requests, render_prompt, stop_token_ids, turn_seed
    from draftline.core.skips import Skips
    from draftline.core.target_loader import load_model, load_target, load_tokenizer

    ev = yaml.safe_load((root / "params.yaml").read_text())["evaluate"]
    info = load_target(root / "data/target/target.json")
    target, tokenizer = load_model(info, dtype=torch.float32), load_tokenizer(info)
    config = json.loads((checkpoint / "config.json").read_text())
    model = getattr(zlab, config["architectures"][0]).from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    prompts = read_prompts(root / "data/prompts/eval.jsonl", Skips(logging.getLogger("peers")))
    requests = [r for r in heldout_requests(prompts, ev["max_prompts_per_source"]) if r.split == split]
    stop, saved = sorted(stop_token_ids(info)), (zlab._cuda_time, zlab._grouped_dynamic_convolve)
    zlab._cuda_time, zlab._grouped_dynamic_convolve = time.perf_counter, short_block_convolve(saved[1])
    out: dict[str, Any] = {}
    try:
        for name, sp in ev["sampling"].items():
            per = {}
            for req in requests:
                ids = render_prompt(tokenizer, [*req.prefix, *req.turns[:1]], req.tools,
                                    config["draftline"]["enable_thinking"])
                if len(ids) > ev["max_prompt_tokens"]:
                    continue
                torch.manual_seed(turn_seed(ev["seed"], name, req, 0))
                gen = zlab.dflash_generate(model, target, torch.tensor([ids]), ev["max_new_tokens"], stop,
                                           temperature=sp["temperature"], top_p=sp["top_p"], top_k=sp["top_k"],
                                           return_stats=True)
                if gen.acceptance_lengths:
                    per[f"{req.id}#0"] = (req.source, statistics.mean(gen.acceptance_lengths))
            out[name] = summary(per)
    finally:
        zlab._cuda_time, zlab._grouped_dynamic_convolve = saved
    return out


def short_block_convolve(convolve):
    """z-lab's DFlash 2 convolution (``dflash`` 0.1.0, ``_grouped_dynamic_convolve``) for a block shorter than its
    kernel, which it cannot take: ``F.pad(blocks[:, :-offset], ...)`` of an empty slice is ``offset`` long, not the
    block's length, so a reply whose last step has fewer tokens left than the kernel (2 or 3 of kernel 4) crashes.
    Such a block is padded at its end with zero positions to the kernel's length and cut back: a causal
    convolution's outputs never read later positions, so the kept ones are exactly the block's. Any other block goes
    to z-lab's function unchanged."""
    import torch.nn.functional as F

    def convolve_any(hidden, dynamic, base, group_size):
        length, kernel = hidden.shape[1], base.shape[0]
        if length >= kernel:
            return convolve(hidden, dynamic, base, group_size)
        pad = kernel - length
        out = convolve(F.pad(hidden, (0, 0, 0, pad)), F.pad(dynamic, (0, 0, 0, 0, 0, pad)), base, group_size)
        return out[:, :length]

    return convolve_any


def summary(per: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """z-lab's acceptance overall and per source from per-request figures (kept for the paired comparisons)."""
    sources: dict[str, list[float]] = {}
    for source, value in per.values():
        sources.setdefault(source, []).append(value)
    return {"acceptance": round(statistics.mean(v for _, v in per.values()), 4),
            "per_source": {k: round(statistics.mean(v), 4) for k, v in sorted(sources.items())},
            "requests": {k: list(v) for k, v in per.items()}}


# -- one drafter, one seed -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    name: str
    trainer: str  # draftline, specforge or speculators
    architecture: str  # dflash or dflash2 (a draftline variant: what its params say; known after training)
    variant: Variant | None = None
    loss: str | None = None  # speculators' --loss-fn


def jobs(trainers: list[str], variants: list[Variant], losses: list[str], peer: Variant | None = None) -> list[Job]:
    """The drafters to train: draftline's variants, SpecForge's DFlash 1, speculators' DFlash 1 and 2 per loss (a
    loss other than ce is in the name), the peers' with ``peer``'s settings when given (its name in theirs)."""
    out = []
    if "draftline" in trainers:
        out += [Job(f"draftline-{v.name}", "draftline", "", v) for v in variants]
    tag = f"-{peer.name}" if peer else ""
    if "specforge" in trainers:
        out.append(Job(f"specforge-dflash{tag}", "specforge", "dflash", peer))
    if "speculators" in trainers:
        out += [Job(f"speculators-{a}" + ("" if loss == "ce" else f"-{loss}") + tag, "speculators", a, peer, loss)
                for loss in losses for a in ("dflash", "dflash2")]
    return out


def peer_overrides(peer: Variant) -> dict[str, Any]:
    """``--peer-variant``'s overrides as Settings fields; a key the peers' mapping does not read is refused (checked
    when the arguments are read, before any clone is built)."""
    known = {f.name for f in fields(Settings)}
    overrides = {dotted.removeprefix("train."): value for dotted, value in peer.overrides.items()}
    for key in overrides.keys() - known:
        raise SystemExit(f"--peer-variant {peer.name}: train.{key} is not a train setting the peers' mapping reads "
                         f"({', '.join(sorted(known))})")
    return overrides


def peer_settings(s: Settings, peer: Variant) -> Settings:
    """The settings the peers' mapping reads, with ``--peer-variant``'s overrides of params.yaml's train section (to
    give them what a draftline variant of the same keys gets, e.g. its anchors); a value of another kind than the
    setting's own (a list for a number) is refused."""
    overrides = peer_overrides(peer)
    for key, value in overrides.items():
        old = getattr(s, key)
        if old is not None and not isinstance(value, type(old)) and not (isinstance(old, float) and isinstance(value, int)):
            raise SystemExit(f"--peer-variant {peer.name}: train.{key}={value!r} is a {type(value).__name__}, "
                             f"params.yaml's is a {type(old).__name__} ({old!r})")
    return replace(s, **overrides)


def train_job(job: Job, root: Path, work: Path, s: Settings, folder: Path
              ) -> tuple[dict[str, Any], Path, dict[str, torch.Tensor] | None]:
    """Train one drafter; its training figures, its checkpoint in z-lab's layout and (a peer's) its raw weights."""
    if job.trainer == "draftline":
        stats, checkpoint = train_draftline(job.variant, root, folder)
        return stats, checkpoint, None
    if job.trainer == "specforge":
        stats, weights = train_specforge(root, work, s, folder)
    else:
        stats, weights = train_speculators(job.architecture, root, work, s, job.loss, folder)
    return stats, to_zlab(weights, root, s, job.architecture, folder / "checkpoint"), weights


def job_keys(job: Job, root: Path, s: Settings, zlab: bool, split: str) -> dict[str, str]:
    """What made a drafter (``train``) and what judged it (``judge``): a result is reused while its keys match."""
    ev = yaml.safe_load((root / "params.yaml").read_text())["evaluate"]
    peer = asdict(PEERS[job.trainer]) if job.trainer in PEERS else None
    return {"train": digest({"job": asdict(job), "settings": asdict(s), "peer": peer}),
            "judge": digest({"evaluate": ev, "zlab": zlab, "split": split})}


def trained(job: Job, root: Path, work: Path, s: Settings, folder: Path, key: str) -> dict[str, Any]:
    print(f"  {job.name}: training ...", flush=True)
    stats, checkpoint, weights = train_job(job, root, work, s, folder)
    arch = ARCHITECTURES[json.loads((checkpoint / "config.json").read_text())["architectures"][0]]
    print(f"  {job.name}: {stats['global_step']} steps, {stats['s_per_step']:.3f} s/step, {stats['wall_s']:.0f} s",
          flush=True)
    return {"keys": {"train": key}, "name": job.name, "trainer": job.trainer, "architecture": arch,
            "variant": job.variant.overrides if job.variant else None, "loss": job.loss,
            "checkpoint": str(checkpoint), "train": stats, "zlab_load": check_zlab(checkpoint, weights)}


def judged(result: dict[str, Any], root: Path, folder: Path, zlab: bool, split: str, key: str) -> dict[str, Any]:
    print(f"  {result['name']}: evaluating ...", flush=True)
    checkpoint = Path(result["checkpoint"])
    result["eval"] = evaluate(root, checkpoint, folder / "eval", split)
    result["zlab"] = None
    if zlab:
        t0 = time.perf_counter()
        result["zlab"] = {**zlab_loop(root, checkpoint, split), "seconds": round(time.perf_counter() - t0, 1)}
    result["keys"]["judge"] = key
    return result


def run_job(job: Job, root: Path, work: Path, s: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """A drafter trained, checked and judged; its training and its judging reused from its result.json while the
    same inputs made them (a smoke test's ``--steps`` drafters have folders of their own)."""
    if job.trainer in PEERS and job.variant:
        s = peer_settings(s, job.variant)
    folder = work / "drafters" / (job.name + (f"-{s.max_steps}steps" if args.steps else ""))
    folder.mkdir(parents=True, exist_ok=True)
    keys = job_keys(job, root, s, args.zlab, args.split)
    result_file = folder / "result.json"
    old = json.loads(result_file.read_text()) if result_file.is_file() and not args.retrain else {}
    result = old if old.get("keys", {}).get("train") == keys["train"] else None
    if result is None:
        result = trained(job, root, work, s, folder, keys["train"])
        result_file.write_text(json.dumps(result, indent=1))  # judging it again must not cost the training
    if result.get("keys", {}).get("judge") != keys["judge"]:
        result = judged(result, root, folder, args.zlab, args.split, keys["judge"])
        result_file.write_text(json.dumps(result, indent=1))
    else:
        print(f"  {job.name}: reused ({result_file})", flush=True)
    return result


def check_layouts(results: dict[str, dict[str, Any]], root: Path) -> None:
    """Each peer's checkpoint in the layout of a draftline checkpoint of its architecture (one trained here, else the
    clone's own ``data/checkpoints`` when it is of that architecture)."""
    clone = root / "data" / "checkpoints"
    refs = {ARCHITECTURES[json.loads((clone / "config.json").read_text())["architectures"][0]]: clone}
    refs.update({r["architecture"]: Path(r["checkpoint"]) for r in results.values() if r["trainer"] == "draftline"})
    for r in results.values():
        if r["trainer"] != "draftline" and r["architecture"] in refs:
            check_layout(Path(r["checkpoint"]), refs[r["architecture"]])


# -- equal wall time -----------------------------------------------------------------------------------------------

def matched_steps(ref: dict[str, Any], peer: dict[str, Any]) -> int:
    """draftline's steps that fill the peer's time from the export to its drafter (its hidden states and its
    training: draftline's train stage makes the same features inside its own wall), from draftline's start-up (wall
    minus steps x s/step) and s/step of its reference drafter of this run, rounded down to 100 steps (any error in the
    peer's favour)."""
    t = ref["train"]
    startup = t["wall_s"] - t["steps"] * t["s_per_step"]
    wall = peer["hidden_states_s"] + peer["train"]["wall_s"]
    return max(100, int((wall - startup) / t["s_per_step"]) // 100 * 100)


def equal_time_jobs(results: dict[str, dict[str, Any]], specs: list[str], losses: list[str],
                    peer: Variant | None) -> list[tuple[Job, str]]:
    """Per ``--equal-time`` spec (a peer drafter's name, or ``NAME=STEPS``: steps fitted on another seed's run),
    draftline's reference drafter of that peer's architecture again at the steps that take the peer's wall time,
    with the peer it is judged against."""
    refs = references(results)
    arch = {j.name: j.architecture for j in jobs(list(PEERS), [], losses, peer)}
    out = []
    for spec in specs:
        name, _, given = spec.partition("=")
        if given and not given.isdigit():
            raise SystemExit(f"--equal-time {spec}: STEPS must be a whole number of steps")
        if name not in arch or arch[name] not in refs or (not given and name not in results):
            raise SystemExit(f"--equal-time {spec}: not a peer's drafter with a draftline drafter of its architecture "
                             f"in this run (trained here: {', '.join(results)}); give NAME=STEPS without the peer")
        ref = results[refs[arch[name]]]
        steps = int(given) if given else matched_steps(ref, results[name])
        variant = Variant(f"{ref['name'].removeprefix('draftline-')}-at-{name}-time",
                          {**ref["variant"], "train.max_steps": steps})
        out.append((Job(f"draftline-{variant.name}", "draftline", "", variant), name))
    return out


def sources_behind(diff: dict[str, Any], labels: dict[str, str]) -> str:
    """The sources of a paired difference (``paired``'s result) whose interval lies below 0, per setting."""
    behind = [f"{labels[k]}: {src} {interval(iv)}" for k in labels
              for src, iv in diff[k]["per_source"].items() if iv["high"] < 0]
    return "; ".join(behind) or "none"


def equal_time_table(runs: list[dict[str, Any]], pooled: dict[str, Any], labels: dict[str, str]) -> str:
    """Each time-matched draftline drafter minus its peer: steps and wall seconds per seed, the pooled difference and
    the sources whose interval is below 0."""
    rows = []
    for name, diff in pooled.items():
        peer = diff["minus"]
        per = [(r["drafters"][name]["train"], r["drafters"][peer]["train"]) for r in runs]
        hidden = [r["drafters"][peer].get("hidden_states_s") for r in runs]  # absent from runs before 2026-12-05
        rows.append([name, f"{peer} ({per[0][1]['steps']})", ", ".join(str(d["steps"]) for d, _ in per),
                     ", ".join(f"{d['wall_s']:.0f} / " + ("" if h is None else f"{h:.0f} + ") + f"{p['wall_s']:.0f}"
                               for (d, p), h in zip(per, hidden)),
                     *[interval(diff[k]["overall"]) for k in labels], sources_behind(diff, labels)])
    return table(["draftline", "minus (its steps)", "draftline steps",
                  "wall s, draftline / peer (hidden states + training)", *labels.values(), "sources behind"], rows)


# -- paired comparisons --------------------------------------------------------------------------------------------

def requests_of(result: dict[str, Any], setting: str, prefix: str = "") -> dict[str, tuple[str, float]]:
    """The evaluate stage's per-request acceptance of one drafter and setting (kept in its result)."""
    return {prefix + k: (src, value) for k, (src, value) in result["eval"][setting]["requests"].items()}


def references(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """draftline's drafter each architecture is compared with: the first variant of that architecture."""
    refs: dict[str, str] = {}
    for name, r in results.items():
        if r["trainer"] == "draftline":
            refs.setdefault(r["architecture"], name)
    return refs


def comparisons(per_seed: list[dict[str, dict[str, Any]]], settings: list[str], resamples: int, seed: int
                ) -> dict[str, Any]:
    """Every drafter minus draftline's of its architecture, per setting, overall and per source, pooled over the
    seeds (keys ``<seed>/<id>#<turn>``)."""
    refs = references(per_seed[0])
    common = [n for n in per_seed[0] if all(n in results for results in per_seed)]
    out: dict[str, Any] = {}
    for name in common:
        ref = refs.get(per_seed[0][name]["architecture"])
        if ref is not None and ref != name:
            out[name] = {"minus": ref, **paired(per_seed, name, ref, settings, resamples, seed)}
    return out


def paired(per_seed: list[dict[str, dict[str, Any]]], name: str, minus: str, settings: list[str], resamples: int,
           seed: int) -> dict[str, Any]:
    """``name`` minus ``minus`` per setting, overall and per source, pooled over the seeds: paired within a seed, the
    interval resampling the seeds and then their requests."""
    from draftline.core.intervals import compare_seeds

    out: dict[str, Any] = {}
    for setting in settings:
        a = [requests_of(results[name], setting, f"{i}/") for i, results in enumerate(per_seed)]
        b = [requests_of(results[minus], setting, f"{i}/") for i, results in enumerate(per_seed)]
        sources = sorted({src for seed in a for src, _ in seed.values()})
        out[setting] = {"overall": compare_seeds(a, b, None, resamples, 0.95, seed).as_dict(),
                        "per_source": {src: compare_seeds(a, b, src, resamples, 0.95, seed).as_dict()
                                       for src in sources}}
    return out


# -- the table -----------------------------------------------------------------------------------------------------

def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def interval(iv: dict[str, Any] | None) -> str:
    return "" if iv is None else f"{iv['estimate']:+.2f} [{iv['low']:+.2f}, {iv['high']:+.2f}]"


def setting_label(root: Path) -> dict[str, str]:
    sampling = yaml.safe_load((root / "params.yaml").read_text())["evaluate"]["sampling"]
    return {k: k if v["temperature"] == 0 else f"T={v['temperature']:g}" for k, v in sampling.items()}


def seeds_table(runs: list[dict[str, Any]], labels: dict[str, str]) -> str:
    names = [n for n in runs[0]["drafters"] if all(n in r["drafters"] for r in runs)]

    def cell(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    rows = []
    for n in names:
        per = [[r["drafters"][n]["eval"][k]["acceptance"] for k in labels] for r in runs]
        rows.append([n, *[cell(v) for v in per], cell([statistics.mean(col) for col in zip(*per)])])
    return table(["drafter", *[f"seed {r['seed']}" for r in runs], "mean"], rows)


def main_table(results: dict[str, dict[str, Any]], diffs: dict[str, Any], labels: dict[str, str]) -> str:
    header = ["trainer", "architecture", *labels.values(), "z-lab loop " + " / ".join(labels.values()),
              "weakest source", "parameters", "s / step", "wall s",
              *[f"minus draftline, {v}" for v in labels.values()]]
    rows = []
    for name, r in results.items():
        ev, zl = r["eval"], r["zlab"] or {}
        weakest = min(ev[next(iter(labels))]["per_source"].items(), key=lambda kv: kv[1])
        rows.append([name, r["architecture"], *[f"{ev[k]['acceptance']:.2f}" for k in labels],
                     " / ".join(f"{zl[k]['acceptance']:.2f}" if k in zl else "-" for k in labels),
                     f"{weakest[0]} {weakest[1]:.2f}", f"{r['zlab_load']['parameters']:,}",
                     f"{r['train']['s_per_step']:.3f}",
                     f"{r['train']['wall_s']:.0f}",
                     *[interval(diffs.get(name, {}).get(k, {}).get("overall")) for k in labels]])
    return table(header, rows)


def source_table(results: dict[str, dict[str, Any]], diffs: dict[str, Any], labels: dict[str, str]) -> str:
    names = list(results)
    sources = sorted(next(iter(results.values()))["eval"][next(iter(labels))]["per_source"])
    rows = [[src, *[" / ".join(f"{results[n]['eval'][k]['per_source'].get(src, float('nan')):.2f}" for k in labels)
                    for n in names]] for src in sources]
    out = table(["source (" + " / ".join(labels.values()) + ")", *names], rows)
    compared = [n for n in names if n in diffs]
    if compared:
        rows = [[src, *[" / ".join(interval(diffs[n][k]["per_source"].get(src)) for k in labels)
                        for n in compared]] for src in sources]
        out += "\n\nPaired difference per source, minus draftline's drafter of the same architecture:\n\n"
        out += table(["source", *[f"{n} - {diffs[n]['minus']}" for n in compared]], rows)
    return out


# -- the run -------------------------------------------------------------------------------------------------------

def measure_seed(seed: int, args: argparse.Namespace, variants: list[Variant]) -> dict[str, Any]:
    root, repro = prepare_clone(seed, args.keep, args.project)
    print(f"seed {seed}: clone {root}" + (f" (dvc repro {repro:.0f} s)" if repro else " (reused)"), flush=True)
    work = root / ".draftline" / "peers"
    s = read_settings(root, args.steps)
    if args.steps:
        variants = [Variant(v.name, {**v.overrides, "train.max_steps": args.steps}) for v in variants]
    features = write_features(root, work, s) if set(args.trainers) & set(PEERS) else None
    results = {job.name: run_job(job, root, work, s, args)
               for job in jobs(args.trainers, variants, args.speculators_loss, args.peer_variant)
               if job.name not in args.skip}
    for r in results.values():
        if r["trainer"] in PEERS:
            r["hidden_states_s"] = features["peer_s"][r["trainer"]]
    equal_time = {}
    for job, peer in equal_time_jobs(results, args.equal_time, args.speculators_loss, args.peer_variant):
        results[job.name] = run_job(job, root, work, s, args)
        equal_time[job.name] = peer
    check_layouts(results, root)
    return {"seed": seed, "split": args.split, "clone": str(root), "repro_s": repro, "settings": asdict(s),
            "mapped": {"rows_per_step": s.rows_per_step, "anchors_per_pack": s.anchors_per_pack},
            "unmatched": unmatched(s, args.speculators_loss), "features": features, "drafters": results,
            "equal_time": equal_time,
            "labels": setting_label(root)}


def machine() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def named_pairs(runs: list[dict[str, Any]], specs: list[str], labels: dict[str, str], resamples: int,
                seed: int) -> dict[str, Any]:
    """Each ``--pair A~B`` (A minus B, any two drafters of these runs), pooled over the seeds, with the sources
    whose interval lies below 0; printed and returned."""
    per_seed = [r["drafters"] for r in runs]
    out, rows = {}, []
    for spec in specs:
        a, sep, b = spec.partition("~")
        missing = [n for n in (a, b) if not all(n in d for d in per_seed)]
        if not sep or missing:
            raise SystemExit(f"--pair {spec}: expected A~B, two drafters of every run (missing: {', '.join(missing)}; "
                             f"trained: {', '.join(per_seed[0])})")
        out[spec] = paired(per_seed, a, b, list(labels), resamples, seed)
        rows.append([f"{a} - {b}", *[interval(out[spec][k]["overall"]) for k in labels],
                     sources_behind(out[spec], labels)])
    print(f"\nPairs, seeds {[r['seed'] for r in runs]} pooled, paired per request, seeds then requests resampled:\n")
    print(table(["pair", *labels.values(), "sources behind (interval below 0)"], rows))
    return out


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    labels = runs[0]["labels"]
    splits = {r.get("split", "test") for r in runs}  # an --out file older than --split judged test
    if len(splits) > 1:
        raise SystemExit(f"--pool: the runs judged different splits ({', '.join(sorted(splits))})")
    split = splits.pop()
    out = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:], "seeds": runs,
           "pooled": comparisons([r["drafters"] for r in runs], list(labels), args.resamples, args.bootstrap_seed)}
    for r in runs:
        diffs = comparisons([r["drafters"]], list(labels), args.resamples, args.bootstrap_seed)
        r["comparisons"] = diffs
        print(f"\n## Target seed {r['seed']} ({out['machine']}, {out['date']}): z-lab acceptance, {split} split\n")
        print(main_table(r["drafters"], diffs, labels))
        print("\n" + source_table(r["drafters"], diffs, labels))
    if len(runs) > 1:
        print(f"\nAcross target seeds (z-lab acceptance, {split} split, {' / '.join(labels.values())}):\n")
        print(seeds_table(runs, labels))
        print(f"\nPooled over seeds {[r['seed'] for r in runs]}, paired per request, seeds then requests resampled:\n")
        print(table(["drafter", *[f"minus draftline, {v}" for v in labels.values()]],
                    [[f"{n} - {d['minus']}", *[interval(d[k]["overall"]) for k in labels]]
                     for n, d in out["pooled"].items()]))
    if args.pair:
        out["pairs"] = named_pairs(runs, args.pair, labels, args.resamples, args.bootstrap_seed)
    # Pooled over the seeds where the pair ran (an --out file older than --equal-time has none).
    pairs = {n: p for n, p in runs[0].get("equal_time", {}).items() if all(n in r.get("equal_time", {}) for r in runs)}
    if pairs:
        per_seed = [r["drafters"] for r in runs]
        out["equal_time"] = {name: {"minus": peer, **paired(per_seed, name, peer, list(labels), args.resamples,
                                                             args.bootstrap_seed)}
                             for name, peer in pairs.items()}
        print(f"\nAt the peer's wall time, seeds {[r['seed'] for r in runs]} pooled, paired per request, seeds then requests resampled:\n")
        print(equal_time_table(runs, out["equal_time"], labels))
    st, mapped = runs[0]["settings"], runs[0]["mapped"]
    print(f"\nMapped from params.yaml train: SpecForge batch_size {mapped['rows_per_step']} rows, num_anchors "
          f"{st['anchors_per_seq']} a row; speculators {st['max_tokens_per_batch']}-token packs, max_anchors "
          f"{mapped['anchors_per_pack']} a pack; all {st['max_steps']} steps, lr {st['lr']}, warmup "
          f"{st['warmup_ratio']}, cosine, gamma {st['gamma']}, block {st['block_size']}, {st['layers']} layers, "
          f"target layers {st['target_layers']}. Hidden states written in "
          f"{[r['features'] and r['features']['seconds'] for r in runs]} s.")
    peer_variants = {name: r["variant"] for run in runs for name, r in run["drafters"].items()
                     if r["trainer"] in PEERS and r.get("variant")}
    for name, overrides in sorted(peer_variants.items()):
        ps = peer_settings(Settings(**st), Variant(name, overrides))
        print(f"- {name}: trained with {overrides} (SpecForge batch_size {ps.rows_per_step} rows, speculators "
              f"max_anchors {ps.anchors_per_pack} a pack)")
    print("\nNot matched:\n" + "\n".join(f"- {u}" for u in runs[0]["unmatched"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--keep", default=None, help="build each clone here (DIR/seed<seed>, or a path with {seed}) and "
                                                 "leave it; a finished one there is reused")
    ap.add_argument("--project", type=Path, default=None, help="a finished clone to use (one seed)")
    ap.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    ap.add_argument("--draftline-variant", action="append", default=None, metavar="NAME:key=value,...",
                    help=f"a draftline drafter to train (repeatable; default {' and '.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--peer-variant", type=parse_variant, default=None, metavar="NAME:key=value,...",
                    help="train the peers with these overrides of params.yaml's train settings, as their mapping "
                         "reads them, named <peer>-NAME (e.g. a16:anchors_per_seq=16, beside --draftline-variant "
                         "a16:anchors_per_seq=16: the same anchors a step for every trainer)")
    ap.add_argument("--speculators-loss", nargs="+", default=["ce"],
                    help="speculators' --loss-fn, one pair of drafters each (ce: hard labels, the target's argmax; "
                         "kl_div, its DFlash 2 default: the target's whole distribution)")
    ap.add_argument("--no-zlab", dest="zlab", action="store_false", help="skip z-lab's dflash_generate loop")
    ap.add_argument("--split", choices=("dev", "test"), default="test",
                    help="the held-out split judged (core/splits.py): test, the figures reported; dev, the one a "
                         "choice between variants reads (a result judged on the other split is judged again)")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--bootstrap-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="train every drafter this many steps instead of "
                                                              "train.max_steps (a smoke test)")
    ap.add_argument("--skip", nargs="+", default=[], metavar="DRAFTER",
                    help="drafters not to train (e.g. speculators-dflash when only its DFlash 2 is compared)")
    ap.add_argument("--equal-time", nargs="+", default=[], metavar="PEER_DRAFTER[=STEPS]",
                    help="also train draftline's drafter of each named peer drafter's architecture (e.g. "
                         "specforge-dflash, speculators-dflash2) for the steps that take that peer's hidden states "
                         "and training in this run (=STEPS: as fitted on another run), judged against it")
    ap.add_argument("--pool", nargs="+", type=Path, default=None, metavar="OUT_JSON",
                    help="train nothing: print the tables of earlier runs' --out files (one seed each), pooled")
    ap.add_argument("--pair", action="append", default=[], metavar="A~B",
                    help="also print A minus B, pooled over the seeds (repeatable; any two drafters, e.g. "
                         "draftline-specsel~speculators-dflash2)")
    ap.add_argument("--retrain", action="store_true", help="train and judge again even where a result matches")
    ap.add_argument("--out", type=Path, default=None, help="write every figure here (JSON)")
    args = ap.parse_args()
    if args.project is not None and len(args.seeds) != 1:
        raise SystemExit("--project is one clone: give one --seeds value")
    variants = [parse_variant(v) for v in (args.draftline_variant or DEFAULT_VARIANTS)]
    if args.peer_variant:
        peer_overrides(args.peer_variant)
    torch.set_num_threads(1)
    if args.pool:
        runs = [run for f in args.pool for run in json.loads(f.read_text())["seeds"]]
    else:
        unknown = set(args.skip) - {j.name for j in jobs(list(TRAINERS), variants, args.speculators_loss,
                                                         args.peer_variant)}
        if unknown:
            raise SystemExit(f"--skip {' '.join(sorted(unknown))}: no such drafter in this run")
        runs = []
        for seed in args.seeds:
            runs.append(measure_seed(seed, args, variants))
            if args.keep is None and args.project is None:
                shutil.rmtree(runs[-1]["clone"], ignore_errors=True)
    out = report(runs, args)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
