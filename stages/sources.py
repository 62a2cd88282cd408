"""DVC stage `sources@<name>`: one dataset kept as Parquet, as published (reads params.yaml: sources.<name>).
Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.sources.params import load
from draftline.sources.stage import SourceArgs, run_source

if __name__ == "__main__":
    main("sources", SourceArgs, load, run_source)
