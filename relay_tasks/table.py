"""Plain-text tables for the CLI: what ``extract``, ``tune`` and ``status`` print."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned(rows: Sequence[Sequence[str]], left: Collection[int]) -> list[str]:
    """Each row as a line: columns as wide as their widest cell and two spaces apart, the
    ``left`` columns (names) left-aligned and the rest (numbers) right-aligned."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if c in left else cell.rjust(width)
            for c, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
