"""DVC stage `train`: data/merged + data/target -> data/checkpoints (a DFlash drafter), metrics/train.json,
plots/train_loss.csv (reads params.yaml: train). See docs/train.md."""

from draftline.train.params import TrainParams
from draftline.train.stage import run_train

if __name__ == "__main__":
    run_train(TrainParams.load("train"))
