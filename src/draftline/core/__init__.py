"""What every stage shares, and nothing stage-specific: the records and their readers (``records``), the raw
and dataset formats (``raw``, ``dataset``), the one chat render (``chat``), loading the target (``target``),
params (``params``, ``source_spec``), atomic files (``files``), skips, logs, stats, fingerprints and scratch
folders. A change here reruns every stage (each stage's ``dvc.yaml`` deps name this folder)."""
