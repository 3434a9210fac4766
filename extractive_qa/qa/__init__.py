"""Logits -> answers -> files and scores: answers, outputs, qa_settings, squad_metric, model_card."""
