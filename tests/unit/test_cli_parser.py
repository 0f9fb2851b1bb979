"""The command line's parser, built without the launch package for every other command."""

from __future__ import annotations

from traind.cli import build_parser


def test_help_is_the_same_without_the_launch_parser() -> None:
    """`traind --help` lists `launch` with the same line whether or not its parser is built."""
    assert build_parser(launching=False).format_help() == build_parser().format_help()
