"""DVC stage `tokenize`: completions -> tokenized training rows (reads params.yaml: tokenize). Its paths come from
dvc.yaml.

Named tokenize_chats.py, not tokenize.py: run as a script, a file named tokenize.py would shadow the standard
library module ``tokenize`` for everything the stage imports.
"""

from draftline.core.runner import main
from draftline.tokenize.params import load
from draftline.tokenize.stage import TokenizeArgs, run_tokenize

if __name__ == "__main__":
    main("tokenize", TokenizeArgs, load, run_tokenize)
