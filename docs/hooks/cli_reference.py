"""MkDocs hook: the CLI reference page is generated from qir's own argparse parser at build time.

``docs/cli.md`` holds the prose and the marker ``<!-- qir-cli-reference -->``; this hook replaces
the marker with the flag table (``FLAG_MEANINGS``) and every subcommand's help as ``qir CMD --help``
prints it, so the page cannot drift from the parser. Enabled by ``hooks:`` in ``mkdocs.yml``.
"""
from __future__ import annotations

import argparse
import os

MARKER = "<!-- qir-cli-reference -->"
WIDTH = "80"  # argparse wraps help text to $COLUMNS; 80 fits the page


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, list[str], str, argparse.ArgumentParser]]:
    """(name, aliases, one-line help, parser) per subcommand, in ``qir --help`` order."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    seen: dict[int, tuple[str, list[str], str, argparse.ArgumentParser]] = {}
    for name, sub in action.choices.items():
        if id(sub) in seen:
            seen[id(sub)][1].append(name)
        else:
            seen[id(sub)] = (name, [], helps.get(name, ""), sub)
    return list(seen.values())


def _flag_table() -> str:
    from qir.tools.cli.options import FLAG_MEANINGS, HMCT_COMMANDS

    rows = ["| short flag | long option | means |", "|---|---|---|"]
    for short, (longs, meaning) in FLAG_MEANINGS.items():
        rows.append(f"| `{short}` | {', '.join(f'`{x}`' for x in longs)} | {meaning} |")
    hmct = ", ".join(f"`{name}`" for name in sorted(HMCT_COMMANDS))
    return "\n".join(rows) + f"\n\nCommands under hmct's names keep hmct's own flags: {hmct}.\n"


def reference() -> str:
    """The generated Markdown: the flag table, then one section per subcommand."""
    os.environ["COLUMNS"] = WIDTH
    from qir.tools.cli import build_parser

    parser = build_parser()
    parts = ["## Flags that mean the same everywhere\n", _flag_table(), "## qir\n",
             "```text\n" + parser.format_help().rstrip() + "\n```\n"]
    for name, aliases, summary, sub in _subcommands(parser):
        parts.append(f"## qir {name}\n")
        if aliases:
            parts.append("Also: " + ", ".join(f"`qir {a}`" for a in aliases) + ".\n")
        if summary:
            parts.append(summary[0].upper() + summary[1:] + ".\n")
        parts.append("```text\n" + sub.format_help().rstrip() + "\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """MkDocs event: fill the marker of the CLI page."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
