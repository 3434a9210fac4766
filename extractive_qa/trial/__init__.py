"""The trial in Determined: model_io, optimization, perf_metrics, evaluation, progress,
callbacks, launch, checkpoints."""
