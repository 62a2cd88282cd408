"""DVC stage `merge`: python stages/merge.py (reads params.yaml: merge)."""

from draftline.merge.stage import MergeParams, run_merge

if __name__ == "__main__":
    run_merge(
        MergeParams.load("merge"),
        tokenized_dir="data/tokenized",
        target_dir="data/target",
        out_dir="data/merged",
        metrics_path="metrics/merge.json",
    )
