"""Bundled example: a tiny CNN on scikit-learn's 8x8 handwritten digits, as ONNX with calibration and eval data."""
