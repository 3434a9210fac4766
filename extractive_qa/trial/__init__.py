"""The trial in Determined, what model_def.py uses: model_io, optimization, dropout_masks,
perf_metrics, evaluation, callbacks."""
