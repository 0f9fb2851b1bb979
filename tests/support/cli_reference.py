"""docs/cli.md generated from traind's argparse parsers: every command, subcommand and option
with its help, in the order the parser has them (``python -m tests.support.cli_reference >
docs/cli.md``; tests/unit/test_docs.py fails when the page falls behind the parser)."""

from __future__ import annotations

import argparse

from traind.cli import build_parser

INTRO = """\
# Command-line reference

Generated from the parsers in `daemon/traind/cli.py` and `daemon/traind/launch/commands/cli.py` by
`python -m tests.support.cli_reference > docs/cli.md`; `tests/unit/test_docs.py` fails when
this page and the parser disagree. `traind COMMAND --help` prints the same.

The global options are accepted before or after the command name. Results go to stdout, log
lines to stderr (`traind run` logs to stdout, the journal); on a terminal a progress bar and
log lines never share a line. Each command imports only what it needs: `traind --version` no
library at all, `traind status` neither asyncio, aiohttp, pydantic nor structlog, and no
command but `launch` imports the launch package or another store's library.
"""


def _usage(parser: argparse.ArgumentParser) -> str:
    """The parser's usage line, wrapped at a fixed width so the page does not depend on the
    terminal it was generated in."""
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _name(action: argparse.Action) -> str:
    """``-c, --config PATH`` for an option, ``TAG`` for a positional."""
    if not action.option_strings:
        return str(action.metavar or action.dest)
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    if action.choices:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    return f"{names} [{metavar}]" if action.nargs == "?" else f"{names} {metavar}"


def _options(parser: argparse.ArgumentParser, skip: set[tuple[str, ...]]) -> list[str]:
    """The table rows of a parser's arguments, leaving out help and the options in ``skip``
    (the global options, as option strings and help)."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if (*action.option_strings, action.help or "") in skip:
            continue
        text = (action.help or "").replace("|", "\\|")
        rows.append(f"| `{_name(action)}` | {text} |")
    return ["| argument | meaning |", "|---|---|", *rows] if rows else []


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """A parser's subcommands with their parsers, in the order they were added."""
    return [
        (name, sub)
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    ]


def _section(name: str, parser: argparse.ArgumentParser, summary: str,
             skip: set[tuple[str, ...]],
             level: int) -> list[str]:
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    description = parser.description or summary
    if description:
        lines += [description, ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = _options(parser, skip)
    if rows:
        lines += [*rows, ""]
    if parser.epilog and name:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    for sub_name, sub in _subparsers(parser):
        lines += _section(sub_name, sub, _summary(parser, sub_name), skip, level + 1)
    return lines


def _summary(parser: argparse.ArgumentParser, name: str) -> str:
    """The one-line help a subcommand was added with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page for ``parser`` (traind's): the global options once, then each command."""
    top = [f"## `{parser.prog}`", "", parser.description or "", "",
           "```text", _usage(parser), "```", "", *_options(parser, set()), ""]
    if parser.epilog:
        top += [parser.epilog, ""]
    globals_ = {(*a.option_strings, a.help or "") for a in parser._actions}
    commands = [line for name, sub in _subparsers(parser)
                for line in _section(name, sub, _summary(parser, name), globals_, 2)]
    return "\n".join([INTRO, *top, *commands]).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render(build_parser()), end="")
