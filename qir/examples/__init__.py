"""Bundled example models and data."""
