"""The shape of the `qir` command line package: commands are found by discovery, shared flags are
defined once, and `qir calibrate` builds its passes as objects (no pipeline string round trip)."""
from __future__ import annotations

import sys

import pytest

from qir.tools.cli import app, build_parser, commands, main
from qir.tools.cli.commands.calibrate import calibration_passes

from ..conftest import REPO

DATA = str(REPO / "qir" / "examples" / "digits" / "calibration_data")

# the order `qir --help` has always listed the commands in
HELP_ORDER = ["dump", "run", "data", "calibrate", "pipeline", "set-mode", "emit", "evaluate", "sensitivity", "acc-error",
              "distribution", "channelwise", "sensitivity-analysis", "runall", "tune", "import-torch", "check", "consistency",
              "profile", "bad-case", "compare", "numeric-suite", "diff", "view", "profiles", "demo"]


def _commands(parser) -> list[str]:
    sub = next(a for a in parser._actions if a.dest == "command")
    return [c.dest for c in sub._choices_actions]


def test_every_command_module_is_found_and_help_keeps_its_order():
    modules = app.command_modules()
    assert {m.__name__.rsplit(".", 1)[-1] for m in modules} == {
        "model", "data", "calibrate", "engine", "debugger", "torch_import", "check", "consistency", "compare", "profiles",
        "demo", "tune", "view", "diff"}
    assert all(callable(m.add_commands) for m in modules)
    assert _commands(build_parser()) == HELP_ORDER


def test_a_new_module_is_a_new_command(tmp_path, monkeypatch, capsys):
    (tmp_path / "hello.py").write_text(
        "ORDER = 5\n"
        "def add_commands(sub):\n"
        "    p = sub.add_parser('hello', help='say hello')\n"
        "    p.set_defaults(func=lambda args: print('hello') or 3)\n")
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, f"{commands.__name__}.hello", raising=False)
    try:
        assert _commands(build_parser())[0] == "hello"
        assert main(["hello"]) == 3 and capsys.readouterr().out == "hello\n"
    finally:
        sys.modules.pop(f"{commands.__name__}.hello", None)


def test_a_command_module_without_add_commands_is_reported(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("ORDER = 1\n")
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    try:
        with pytest.raises(TypeError, match="defines no add_commands"):
            build_parser()
    finally:
        sys.modules.pop(f"{commands.__name__}.broken", None)


def test_calibrate_builds_the_passes_the_pipeline_string_did():
    from qir.passes import PipelineContext, build_pipeline

    passes = calibration_passes(DATA, march="nash-e", method="percentile", percentile=99.9)
    string = build_pipeline("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e},"
                            "calibrate{method=percentile,percentile=99.9}", PipelineContext(data=DATA))
    assert [p.name for p in passes] == ["fold-bn", "fuse", "insert-calibration", "calibrate"]
    assert [(type(p), repr(p)) for p in passes] == [(type(p), repr(p)) for p in string]
    assert passes[-1].data == DATA and passes[-1].percentile == 99.9


@pytest.mark.parametrize("command, flag, default", [
    ("run", "runtime", "numpy"), ("compare", "runtime", "ort"), ("demo", "runtime", "both"),
    ("calibrate", "march", "nash-e"), ("pipeline", "march", "nash-e"), ("evaluate", "force", False),
])
def test_shared_flags_keep_each_commands_default(command, flag, default):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sub.choices[command].get_default(flag) == default
