"""DVC stage `evaluate`: python stages/evaluate.py (reads params.yaml: evaluate).

The prompts are rendered in the thinking mode of the drafter's training data, which its checkpoint records.
"""

from draftline.evaluate.stage import EvalParams, run_evaluate

if __name__ == "__main__":
    run_evaluate(
        EvalParams.load("evaluate"),
        target_dir="data/target",
        checkpoint="data/checkpoints",
        prompts_path="data/prompts/eval.jsonl",
        metrics_path="metrics/eval.json",
        plot_path="plots/acceptance.csv",
    )
