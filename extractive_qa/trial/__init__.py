"""The trial in Determined: model_io, optimization, dropout_masks, perf_metrics, evaluation,
progress, interruption, callbacks, launch, checkpoints, checkpoint_storage."""
