"""A trained model answering outside the trial, which never imports this stage (ONNX needs
requirements-export.txt): hf_dir, model_weights, onnx_model, model_dir, predictor, export_dir."""
