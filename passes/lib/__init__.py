"""Helpers the passes share that are not passes themselves: observers, range propagation, fusion
groups, node selection, capture, model pairs, discrete-op replay and the PyTorch numeric hooks."""
