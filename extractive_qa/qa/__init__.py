"""Logits -> answers -> files and scores: arithmetic, answers, outputs, qa_settings, squad_metric,
model_card."""
