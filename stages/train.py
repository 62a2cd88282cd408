"""DVC stage `train`: the merged training set + the target -> a DFlash drafter (reads params.yaml: train). Its paths
come from dvc.yaml."""

from draftline.core.runner import main
from draftline.train.args import TrainArgs
from draftline.train.params import load
from draftline.train.stage import run_train

if __name__ == "__main__":
    main("train", TrainArgs, load, run_train)
