"""Extractive question answering on SQuAD with Determined: the library behind the entry scripts.

Stages, in reading order: config -> data -> qa -> resume -> trial -> launch -> serve, then dry_run,
scaling_runs and scaling_report on top; beneath them all errors, reading (the one reader of
every file), model_files (a model directory through it), cli, det_internals, files (where a
command may write, and atomic writes), private_dir (this user's directory for checked copies and
downloads), buckets (a checkpoint in S3 or GCS) and compat. A module imports only from its own stage
or the ones before it. The trial never imports serve (optional dependencies)."""
