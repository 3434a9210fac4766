"""Extractive question answering on SQuAD with Determined: the library behind the entry scripts.

Read in this order:
  settings, config_loading, config_checks             a YAML -> typed settings, checked field by field
  master_mirror, run_plan, model_family               what the master fills in -> the run's plan
  window_counts, plan_checks, dry_run                 the plan's counts and warnings before launch
  squad_sources, squad_json, features, feature_cache  SQuAD files -> windowed features
  batching, model_io, flops                           features -> batches; precision, export
  optimization, evaluation, answers, squad_metric     optimizer and schedule; logits -> EM/F1
  outputs                                             predictions, null odds, n-best files
  callbacks, perf_metrics, progress, det_internals    the trial's hooks into Determined
  run_source, local_launch, checkpoints, pickle_scan  what train.py does before the Trainer
  scaling_types, scaling_runs                         scaling.py's series of runs
  compat                                              differences between library versions
"""
