"""The trial in Determined, what model_def.py uses: model_io, optimization, dropout_masks,
span_loss, perf_metrics, evaluation, callbacks."""
