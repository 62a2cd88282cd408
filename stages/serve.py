"""DVC stage `serve`: the drafter served by a real engine beside the target alone (reads params.yaml: serve, and
evaluate's requests settings). Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.serve.params import load
from draftline.serve.stage import ServeArgs, run_serve

if __name__ == "__main__":
    main("serve", ServeArgs, load, run_serve)
