"""DVC stage `evaluate`: python stages/evaluate.py (reads params.yaml: evaluate, generate.enable_thinking).

The prompts are rendered in the thinking mode they were generated in, so the stage reads that one generate key.
"""

from draftline.drafter.evaluate import EvalParams, run_evaluate
from draftline.params import load_params

if __name__ == "__main__":
    p = load_params("evaluate", "generate")
    run_evaluate(
        EvalParams.from_params(p["evaluate"] or {}, p["generate"] or {}),
        target_dir="data/target",
        checkpoint="data/checkpoints",
        prompts_path="data/prompts/eval.jsonl",
        metrics_path="metrics/eval.json",
        plot_path="plots/acceptance.csv",
    )
