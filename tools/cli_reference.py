"""The command reference (docs/cli.md): what ``relay-tasks --help`` and each verb's ``--help``
print.

    ./dev docs        rewrite that section of docs/cli.md from the parser

tests/test_cli.py requires docs/cli.md to hold exactly this text, so the reference cannot drift
from the parser: a help line, option or default changed on one side only fails the tests.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "cli.md"
START = "<!-- command reference: written by ./dev docs from relay_tasks/cli.py -->"
END = "<!-- end of command reference -->"
#: The width argparse wraps to (it reads COLUMNS), fixed so the text does not follow a terminal.
WIDTH = 100


def render() -> str:
    """Every ``--help``, top level first, then each verb in the parser's order."""
    from relay_tasks.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parser = build_parser()
        pages = [parser.format_help()]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pages += [verb.format_help() for verb in action._name_parser_map.values()]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    body = "\n".join(page.rstrip("\n") + "\n" for page in pages)
    return f"{START}\n```text\n{body}```\n{END}"


def section(document: str) -> str:
    """The reference as the document holds it now (empty if the markers are missing)."""
    if START not in document or END not in document:
        return ""
    return document[document.index(START) : document.index(END) + len(END)]


def main() -> int:
    text = REFERENCE.read_text()
    current = section(text)
    if not current:
        print(f"{REFERENCE} has no {START!r} ... {END!r} section", file=sys.stderr)
        return 1
    REFERENCE.write_text(text.replace(current, render()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
