"""DVC stage `train`: data/merged + data/target -> data/checkpoints (a DFlash drafter), metrics/train.json,
plots/train_loss.csv. See docs/train.md."""

from draftline.drafter.trainer import main
from draftline.params import load_params

if __name__ == "__main__":
    main(load_params("train")["train"])
