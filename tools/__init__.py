"""The `qir` command line and report writers."""
