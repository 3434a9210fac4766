"""The trial in Determined, what model_def.py uses: model_io, optimization, optimizer_recipes,
finite_guard, dropout_masks, cpu_allocator, model_setup, span_loss, perf_metrics, evaluation,
callbacks."""
