"""The numpy reference interpreter and its per-op kernel table."""
