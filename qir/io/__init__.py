"""The IR's file formats: ONNX, onnxruntime QDQ and PyTorch importers; the ONNX exporter and the
``qir::Calibration`` node of the calibrated-model file."""
