"""The ``qir`` command line: the parser, assembled from the command modules, and ``main``.

Errors the user can fix (bad paths, corrupt files, unsupported ops, data that does not fit the
model, a misspelled command: with the closest names; sizes that need more memory than the machine
has) print one line ``qir: error: ...`` (a very long name or path shown cut) and exit with code 2;
``--debug`` shows tracebacks. Flags mean the same in every command (the table in
:mod:`qir.tools.cli.options`, printed by ``qir --help``), except under hmct's command names.
Output files follow one rule (:class:`qir.tools.reports.output.Outputs`): checked before the
work, never replaced without ``--force``, written atomically. Long steps show their progress
with an ETA: a tqdm bar when stderr is a terminal, else a ``qir.progress`` log line every few
seconds (:mod:`qir.tools.progress`).

Commands are found, not listed: every module of :mod:`qir.tools.cli.commands` defines
``add_commands(subparsers)``, which adds its subcommands (each with ``set_defaults(func=...)``),
and ``ORDER``, where its commands appear in ``qir --help`` (then by module name). Adding a
command is adding a module, or a parser block to the module of its family.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import pkgutil
import sys
from types import ModuleType
from typing import Sequence

from qir.data import forget_warnings
from qir.errors import NAME_SHOWN, QirError, did_you_mean
from qir.tools.cli import commands
from qir.tools.cli.options import flags_epilog

__all__ = ["main", "build_parser", "command_modules", "EXIT_USER_ERROR"]

EXIT_USER_ERROR = 2
_LAST = 1000  # the ORDER of a command module that gives none: after the others


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too, with the usage first
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"qir: error: {message}\n")

    def _check_value(self, action, value) -> None:
        """A command name that does not exist: the closest ones (argparse lists all of them)."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            raise argparse.ArgumentError(None, did_you_mean(value, action.choices, "command") + " (qir --help lists them)")
        super()._check_value(action, value)


def command_modules() -> list[ModuleType]:
    """Every module of :mod:`qir.tools.cli.commands`, in ``qir --help`` order (``ORDER``, then name)."""
    found = [importlib.import_module(f"{commands.__name__}.{info.name}")
             for info in pkgutil.iter_modules(commands.__path__) if not info.name.startswith("_")]
    for module in found:
        if not callable(getattr(module, "add_commands", None)):
            raise TypeError(f"{module.__name__} is in the command package but defines no add_commands(subparsers)")
    return sorted(found, key=lambda m: (getattr(m, "ORDER", _LAST), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    """The ``qir`` parser: global flags, then the subcommands of every command module."""
    parser = _ArgumentParser(prog="qir", description="Find why a quantized network lost accuracy.",
                             epilog=flags_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    for module in command_modules():
        module.add_commands(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _unknown_flags(parser: argparse.ArgumentParser, command: str, extras: list[str]) -> None:
    """Arguments the command does not take: its own usage (not all of qir's), the first unknown
    flag with the command's closest flags, and where the output folder goes if that was meant."""
    sub = _subparser(parser, command)
    flags = [o for a in sub._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    unknown = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), None)
    if unknown is None:
        sub.error(f"unrecognized arguments: {' '.join(extras)}")
    long_flags = [f for f in flags if f.startswith("--")]  # (close matches of a one-letter flag mean nothing)
    hint = did_you_mean(unknown, long_flags if unknown.startswith("--") else [], f"flag of qir {command}")
    if unknown in ("-s", "--save-dir", "-o", "--output") and "--output" in flags:
        hint += "; the output folder is -o/--output here"
    elif unknown in ("-o", "--output", "-s", "--save-dir") and "--save-dir" in flags:
        hint += "; the output folder is -s/--save-dir here (hmct's flags)"
    sub.error(f"{hint} (qir {command} --help lists them)")


def _thread_limit(threads: int | None):
    """``--threads`` for everything a command runs (:func:`qir.runtimes.ort.backend.thread_limit`:
    the sessions its passes build on their own too, such as calibration's); nothing without it."""
    if not threads:
        return contextlib.nullcontext()
    from qir.runtimes.ort.backend import thread_limit

    return thread_limit(threads)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``qir`` command line on ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _unknown_flags(parser, args.command, extras)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("qir.progress").setLevel(logging.INFO)  # progress lines when stderr is no terminal
    logging.getLogger("qir.data").setLevel(logging.INFO)  # which dynamic dimensions the data fixes (one line)
    forget_warnings()  # each command names the NaN/Inf samples it reads, whatever ran before in this process
    try:
        with _thread_limit(getattr(args, "threads", None)):
            return int(args.func(args) or 0)
    except QirError as exc:
        if args.debug:
            raise
        print(f"qir: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # e.g. `qir dump model.onnx | head`: the reader is gone, not an error
            sys.stderr.close()
            return 0
        if args.debug:
            raise
        name = str(exc.filename or "")
        name = name if len(name) <= NAME_SHOWN else f"{name[:NAME_SHOWN]}... ({len(name)} characters)"
        print(f"qir: error: {exc.strerror or exc}: {name}".rstrip(": "), file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError as exc:  # the input asks for more than this machine has: not a bug in qir
        if args.debug:
            raise
        print(f"qir: error: not enough memory ({exc or 'MemoryError'}): the inputs or options ask for more than "
              "this machine has; use smaller sizes or fewer samples", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("qir: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in qir: say so in one line, traceback on --debug
        if args.debug:
            raise
        print(f"qir: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the "
              "traceback, and please report it)", file=sys.stderr)
        return 1
