"""The command line every experiment shares: ``python -m minidist.experiments.NAME``
with ``--full`` (the reduced form runs in seconds), and, for those that draw
pictures, ``--output`` (a folder, created)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def experiment_parser(name: str, description: str, full_help: str) -> argparse.ArgumentParser:
    """A parser for experiment ``name`` with its ``--full`` switch."""
    parser = argparse.ArgumentParser(prog=f"python -m minidist.experiments.{name}",
                                     description=description)
    parser.add_argument("--full", action="store_true", help=full_help)
    return parser


def parse_with_output(parser: argparse.ArgumentParser, argv, default: str, what: str):
    """``(args, output folder)`` with ``--output`` added (default ``default``,
    holding ``what``) and the folder created; the folder is None, said on
    stderr, when it cannot be created (main then returns 2)."""
    parser.add_argument("--output", default=default,
                        help=f"folder for {what} (default: %(default)s)")
    args = parser.parse_args(argv)
    output = Path(args.output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"cannot create the output folder {output}: {error}", file=sys.stderr)
        return args, None
    return args, output
