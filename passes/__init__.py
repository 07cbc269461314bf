"""Transformation and analysis passes over the QIR, one pass per module."""
