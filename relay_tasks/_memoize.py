"""TVM's ``pickle_memoize`` reads pickles from the current directory: keep it in memory instead.

``tvm.topi.nn.winograd_util`` memoizes its transform matrices with
``tvm.contrib.pickle_memoize``, whose cache, created when ``tvm.topi`` is imported, creates
``.pkl_memoize_py3/`` in the current directory and unpickles the file it finds there. Unpickling
runs code, so ``import tvm.relay`` in a directory holding a crafted file (an unpacked model
archive, a shared work dir) would run it. Swapping the cache class before ``tvm.topi`` is
imported keeps every memoized value in memory (TVM only saves winograd's at exit when asked, and
it is not), so no directory is created and no file is read.
"""

from __future__ import annotations

from typing import Any


def keep_memoize_in_memory() -> None:
    """Replace ``pickle_memoize.Cache`` with a cache that never touches the file system.

    Does nothing for caches made before it runs (``tvm.topi`` already imported).
    """
    from tvm.contrib import pickle_memoize

    if getattr(pickle_memoize.Cache, "in_memory", False):
        return

    class InMemoryCache(pickle_memoize.Cache):  # type: ignore[misc]
        in_memory = True

        def __init__(self, key: str, save_at_exit: bool) -> None:
            self.path = None
            self.cache: dict[Any, Any] = {}
            self.dirty = False
            self.save_at_exit = False

        def save(self) -> None:
            pass

    pickle_memoize.Cache = InMemoryCache


keep_memoize_in_memory()
