"""The `qir` command line's flags: every option explains itself, a short flag means the same in
every command (tools/cli/options.py FLAG_MEANINGS) except under hmct's command names, which keep
hmct's own flags, and a misspelled command gets suggestions."""
from __future__ import annotations

import argparse

import pytest

from qir.tools.cli import build_parser, main
from qir.tools.cli.options import FLAG_MEANINGS, HMCT_COMMANDS


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"qir": parser, **sub.choices}


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_option_of_every_command_has_help_text():
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in _commands().items()
               for a in _options(p) if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_a_short_flag_means_the_same_in_every_qir_command():
    wrong = []
    for name, parser in _commands().items():
        if name in HMCT_COMMANDS:
            continue
        for action in parser._actions:
            longs = {o for o in action.option_strings if o.startswith("--")}
            for short in (o for o in action.option_strings if not o.startswith("--")):
                declared = FLAG_MEANINGS.get(short, ((), ""))[0]
                if not longs & set(declared):
                    wrong.append(f"{name}: {short} is {'/'.join(sorted(longs))}, declared {declared or 'nowhere'}")
    assert wrong == []


def test_hmct_command_names_keep_hmct_flags_and_qir_names_the_qir_meaning():
    commands = _commands()
    assert HMCT_COMMANDS <= set(commands)

    def dest(command, flag):
        return next(a.dest for a in commands[command]._actions if flag in a.option_strings)

    assert dest("get-sensitivity-of-nodes", "-o") == "output_node" and dest("runall", "-o") == "output_node"
    assert dest("get-sensitivity-of-nodes", "-n") == "node_type" and dest("plot-distribution", "-n") == "nodes_list"
    assert dest("plot-acc-error", "-a") == "average_mode"
    assert dest("sensitivity", "-o") == dest("sensitivity", "-s") == "save_dir"  # the output folder
    assert dest("sensitivity", "--output-node") == "output_node"
    assert dest("compare", "-o") == "output" and dest("calibrate", "-o") == "output"


def test_qir_sensitivity_takes_o_for_its_output_folder():
    # `qir sensitivity MODEL DATA -o ns_out` once failed: -o was the output node there
    args = build_parser().parse_args(["sensitivity", "cal.onnx", "data", "-o", "ns_out", "--node-type", "weight"])
    assert (args.save_dir, args.node_type, args.output_node) == ("ns_out", "weight", None)
    hmct = build_parser().parse_args(["get-sensitivity-of-nodes", "cal.onnx", "data", "-o", "conv2", "-n", "weight"])
    assert (hmct.save_dir, hmct.node_type, hmct.output_node) == ("./debug_result/node_sensitivity", "weight", "conv2")


def test_help_lists_the_flag_table(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(short in out for short in FLAG_MEANINGS) and "get-sensitivity-of-nodes" in out


@pytest.mark.parametrize("typo, suggestion", [("sensitivty", "'sensitivity'"), ("calibrat", "'calibrate'"),
                                              ("plot-acc-eror", "'plot-acc-error'")])
def test_a_misspelled_command_gets_suggestions(typo, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([typo, "model.onnx"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"qir: error: no command named {typo!r}; did you mean" in err and suggestion in err
