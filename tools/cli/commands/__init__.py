"""The ``qir`` subcommands, one module per family, found by :func:`qir.tools.cli.app.command_modules`.

Each module defines ``add_commands(subparsers)``, which adds its subcommands to the ``qir``
parser (each with ``set_defaults(func=cmd_...)``), and ``ORDER``, where they appear in
``qir --help``. Modules whose name starts with ``_`` are skipped (private helpers).
"""
