"""Logits -> answers -> files and scores: mixed_precision, answers, outputs, qa_settings, squad_metric,
model_card."""
