"""onnxruntime: the backend and the lowerings of calibration nodes to ONNX it runs."""
