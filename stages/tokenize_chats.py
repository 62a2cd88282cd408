"""DVC stage `tokenize`: python stages/tokenize_chats.py (reads params.yaml: tokenize).

Named tokenize_chats.py, not tokenize.py: run as a script, a file named tokenize.py would shadow the standard
library module ``tokenize`` for everything the stage imports.
"""

from draftline.tokenize.params import TokenizeParams
from draftline.tokenize.stage import run_tokenize

if __name__ == "__main__":
    run_tokenize(
        completions_dir="data/completions",
        target_dir="data/target",
        out_dir="data/tokenized",
        metrics_path="metrics/tokenize.json",
        plot_path="plots/seq_len.csv",
        params=TokenizeParams.load("tokenize"),
    )
