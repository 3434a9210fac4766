"""The trial in Determined: model_io, optimization, dropout_masks, perf_metrics, evaluation,
progress, interruption, callbacks, launch, checkpoint_archive, checkpoint_decode, checkpoint_rewrite,
checkpoints, checkpoint_storage."""
