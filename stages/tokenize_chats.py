"""DVC stage `tokenize`: python stages/tokenize_chats.py (reads params.yaml: tokenize).

Named tokenize_chats.py, not tokenize.py: run as a script, a file named tokenize.py would shadow the standard
library module ``tokenize`` for everything the stage imports.
"""

from draftline.params import load_params
from draftline.tokenize import TokenizeParams, run_tokenize

if __name__ == "__main__":
    params = TokenizeParams.from_params(load_params("tokenize")["tokenize"])
    run_tokenize(
        completions_dir="data/completions",
        target_dir="data/target",
        out_dir="data/tokenized",
        metrics_path="metrics/tokenize.json",
        plot_path="plots/seq_len.csv",
        params=params,
    )
