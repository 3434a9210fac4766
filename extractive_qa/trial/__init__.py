"""The trial in Determined: model_io, optimization, perf_metrics, evaluation, progress,
interruption, callbacks, launch, checkpoints, checkpoint_storage."""
