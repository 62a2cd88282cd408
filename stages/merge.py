"""DVC stage `merge`: python stages/merge.py (reads params.yaml: merge)."""

from draftline.merge import MergeParams, run_merge
from draftline.params import load_params

if __name__ == "__main__":
    run_merge(
        MergeParams.from_params(load_params("merge")["merge"]),
        tokenized_dir="data/tokenized",
        target_dir="data/target",
        out_dir="data/merged",
        metrics_path="metrics/merge.json",
    )
