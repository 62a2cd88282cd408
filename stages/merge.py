"""DVC stage `merge`: a base training set + the tokenized rows -> the merged training set (reads params.yaml:
merge). Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.merge.params import load
from draftline.merge.stage import MergeArgs, run_merge

if __name__ == "__main__":
    main("merge", MergeArgs, load, run_merge)
