"""Progress bars on stderr, only when a person is watching (a terminal), never in pipes or CI."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], label: str) -> Iterator[T]:
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=label, file=sys.stderr, leave=False)
