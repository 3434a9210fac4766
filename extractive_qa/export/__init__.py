"""A trained model out of the trial, for serving: onnx_model."""
