"""A trained model answering outside the trial, which never imports this stage (ONNX needs
requirements-export.txt): onnx_model, model_dir, predictor, export_dir."""
