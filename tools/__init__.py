"""The `qir` command line and report writers.

Importing this package makes the library's progress reports tqdm bars on terminals (periodic log
lines otherwise): :mod:`qir.tools.progress`.
"""
from qir.tools.progress import install as _install_progress

_install_progress()
