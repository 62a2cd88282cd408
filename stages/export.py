"""DVC stage `export`: the merged set -> other trainers' formats (reads params.yaml: export). Its paths come from
dvc.yaml."""

from draftline.core.runner import main
from draftline.export.params import load
from draftline.export.stage import ExportArgs, run_export

if __name__ == "__main__":
    main("export", ExportArgs, load, run_export)
