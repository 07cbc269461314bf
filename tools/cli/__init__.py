"""The ``qir`` command line (``qir = qir.tools.cli:main``). Every command is a thin layer over the Python API.

- :mod:`qir.tools.cli.app`: ``main``, error handling, logging and the parser, assembled from
- :mod:`qir.tools.cli.commands`: one module per command family, found by discovery, and
- :mod:`qir.tools.cli.options`: the flags and helpers several commands share.
"""
from __future__ import annotations

from qir.tools.cli.app import build_parser, main

__all__ = ["main", "build_parser"]
