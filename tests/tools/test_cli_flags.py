"""The `qir` command line's flags: every option explains itself, a short flag means the same in
every command (tools/cli/options.py FLAG_MEANINGS) except under hmct's command names, which keep
hmct's own flags, and a misspelled command gets suggestions."""
from __future__ import annotations

import argparse

import pytest

from qir.tools.cli import build_parser, main
from qir.tools.cli.options import FLAG_MEANINGS, HMCT_COMMANDS, OLD_SAMPLE_FLAGS


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"qir": parser, **sub.choices}


def _old_names(action: argparse.Action) -> bool:
    """A sample-count flag a command took before ``-d/--data-num``: still read, hidden from help."""
    return action.help == argparse.SUPPRESS and set(action.option_strings) <= OLD_SAMPLE_FLAGS


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not _old_names(a)]


def test_every_option_of_every_command_has_help_text():
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in _commands().items()
               for a in _options(p) if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_a_short_flag_means_the_same_in_every_qir_command():
    wrong = []
    for name, parser in _commands().items():
        if name in HMCT_COMMANDS:
            continue
        for action in _options(parser):
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


def test_qir_named_commands_agree_on_output_sample_count_and_cluster():
    """-o/--output is where every qir-named command writes; -d/--data-num its sample count (the old
    spellings are read but not shown); -c/--cluster wherever its work can be sharded. hmct-named
    commands keep hmct's flags and say so in their help."""
    wrong = []
    for name, parser in _commands().items():
        if name == "qir":
            continue
        options = _options(parser)
        if name in HMCT_COMMANDS:
            if "hmct" not in (parser.description or ""):
                wrong.append(f"{name}: its help does not say it takes hmct's flags")
            continue
        for action in options:
            strings = set(action.option_strings)
            if action.dest in ("save_dir", "output") and not {"-o", "--output"} <= strings:
                wrong.append(f"{name}: writes to {'/'.join(action.option_strings)}, not -o/--output")
            if action.dest in ("data_num", "limit", "num", "num_steps") and strings != {"-d", "--data-num"}:
                wrong.append(f"{name}: counts samples with {'/'.join(action.option_strings)}, not -d/--data-num")
            if "--cluster" in strings and "-c" not in strings:
                wrong.append(f"{name}: --cluster without -c")
            if strings & OLD_SAMPLE_FLAGS:
                wrong.append(f"{name}: shows the old sample-count flag {'/'.join(strings & OLD_SAMPLE_FLAGS)}")
    assert wrong == []


@pytest.mark.parametrize("argv, old, dest", [(["run", "m", "d", "--limit", "2"], "--limit", "data_num"),
                                            (["consistency", "m", "d", "-n", "2"], "-n", "data_num"),
                                            (["compare", "a", "b", "d", "--num-steps", "2"], "--num-steps", "data_num")])
def test_old_sample_count_flags_still_read(argv, old, dest):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == 2
    new = build_parser().parse_args([a if a != old else "-d" for a in argv])
    assert getattr(new, dest) == 2


def test_an_unknown_flag_prints_the_command_usage_and_where_the_output_goes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "a.onnx", "b.onnx", "data", "-s", "out"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: qir compare") and "usage: qir [-h]" not in err  # the command's usage, not qir's
    assert "no flag of qir compare named '-s'" in err and "the output folder is -o/--output here" in err
    with pytest.raises(SystemExit):
        main(["compare", "a.onnx", "b.onnx", "data", "--metirc", "L1"])
    assert "did you mean '--metric'" in capsys.readouterr().err


def test_runall_refuses_an_unknown_output_node_before_any_work(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    import qir.examples.digits as digits  # the bundled example

    model, data = Path(digits.__file__).parent / "model.onnx", Path(digits.__file__).parent / "calibration_data"
    monkeypatch.chdir(tmp_path)
    calibrated = tmp_path / "cal.onnx"
    assert main(["calibrate", str(model), str(data), "-o", str(calibrated)]) == 0
    capsys.readouterr()
    assert main(["runall", str(calibrated), str(data), "-o", "ra_out"]) == 2
    err = capsys.readouterr().err
    assert "no output node named 'ra_out'" in err and "the output folder is -s/--save-dir" in err
    assert not (tmp_path / "debug_result").exists() and not (tmp_path / "ra_out").exists()  # nothing was written
