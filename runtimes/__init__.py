"""Runtimes that execute a QIR: the numpy reference interpreter and the onnxruntime backend."""
