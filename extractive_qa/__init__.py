"""Extractive question answering on SQuAD with Determined: the library behind the entry scripts.

Stages, in reading order: config -> data -> qa -> resume -> trial -> launch -> serve, then dry_run,
scaling_runs and scaling_report on top; beneath them all the base: errors, det_internals (every use
of Determined's internals, each with its reason), io/ (the one reader of every file, a model
directory through it, where a command may write and how), cli (what every entry script does
first), storage/ (where a checkpoint lies -- a directory, a bucket, a master -- read the same way
from each, into this user's private directory) and compat. A module imports only from its own
stage or the ones before it. The trial never imports serve (optional dependencies)."""
