"""Extractive question answering on SQuAD with Determined: the library behind the entry scripts.

Read in this order:
  settings, config_loading, master_mirror, run_plan   a YAML -> a checked run plan
  squad_sources, squad_json, features, feature_cache  SQuAD files -> windowed features
  batching, model_io, flops                            features -> batches; precision, export
  optimization, evaluation, answers, squad_metric      optimizer and schedule; logits -> EM/F1
  callbacks, perf_metrics, progress, det_internals     the trial's hooks into Determined
  run_source, local_launch, checkpoints, dry_run       what train.py does before the Trainer
  scaling_types, scaling_runs                          scaling.py's series of runs
  compat                                               differences between library versions
"""
