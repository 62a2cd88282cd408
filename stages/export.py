"""DVC stage `export`: data/merged -> data/export/<format>/ (reads params.yaml: export)."""

from draftline.export.stage import ExportParams, run_export

if __name__ == "__main__":
    run_export(ExportParams.load("export"))
