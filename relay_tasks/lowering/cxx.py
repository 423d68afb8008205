"""Bit-exact stand-ins for the few C++ standard-library behaviours that show in upstream's output.

Upstream's task names, task order and Ansor's task order are shaped by libstdc++ details: the
``std::hash<std::string>`` that shortens long fused names, the unstable ``std::sort`` that orders
MetaSchedule's anchor-block tasks, and the iteration order of ``std::unordered_map``. To equal
upstream exactly we reproduce those algorithms here, each checked against upstream in the tests.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907

T = TypeVar("T")


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def std_hash_bytes(data: bytes, seed: int = _SEED) -> int:
    """libstdc++'s 64-bit ``_Hash_bytes``, which is what ``std::hash<std::string>`` returns."""
    length = len(data)
    aligned = length & ~7
    value = (seed ^ (length * _MUL)) & _MASK
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        word = (_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        value = ((value ^ word) * _MUL) & _MASK
    if length & 7:
        word = int.from_bytes(data[aligned:], "little")
        value = ((value ^ word) * _MUL) & _MASK
    value = (_shift_mix(value) * _MUL) & _MASK
    return _shift_mix(value)


def std_hash_string(text: str) -> int:
    """``std::hash<std::string>`` of the UTF-8 bytes of ``text``."""
    return std_hash_bytes(text.encode())


def hash_combine(key: int, value_hash: int) -> int:
    """dmlc's ``HashCombine`` over two already-hashed values."""
    return (key ^ (value_hash + 0x9E3779B9 + ((key << 6) & _MASK) + (key >> 2))) & _MASK


_THRESHOLD = 16


def std_sort(items: Sequence[T], less: Callable[[T, T], bool]) -> list[T]:
    """libstdc++'s ``std::sort`` (introsort + final insertion sort), including its instability.

    Which of several equal elements comes first decides which task name upstream keeps, so a stable
    Python sort would give other names; this follows the library step by step.
    """
    seq = list(items)
    n = len(seq)
    if n > 1:
        _introsort_loop(seq, 0, n, 2 * (n.bit_length() - 1), less)
        _final_insertion_sort(seq, 0, n, less)
    return seq


def _introsort_loop(
    a: list[T], first: int, last: int, depth: int, less: Callable[[T, T], bool]
) -> None:
    while last - first > _THRESHOLD:
        if depth == 0:
            _heap_sort(a, first, last, less)
            return
        depth -= 1
        mid = first + (last - first) // 2
        _move_median_to_first(a, first, first + 1, mid, last - 1, less)
        cut = _unguarded_partition(a, first + 1, last, first, less)
        _introsort_loop(a, cut, last, depth, less)
        last = cut


def _move_median_to_first(
    a: list[T], result: int, x: int, y: int, z: int, less: Callable[[T, T], bool]
) -> None:
    if less(a[x], a[y]):
        if less(a[y], a[z]):
            a[result], a[y] = a[y], a[result]
        elif less(a[x], a[z]):
            a[result], a[z] = a[z], a[result]
        else:
            a[result], a[x] = a[x], a[result]
    elif less(a[x], a[z]):
        a[result], a[x] = a[x], a[result]
    elif less(a[y], a[z]):
        a[result], a[z] = a[z], a[result]
    else:
        a[result], a[y] = a[y], a[result]


def _unguarded_partition(
    a: list[T], first: int, last: int, pivot: int, less: Callable[[T, T], bool]
) -> int:
    while True:
        while less(a[first], a[pivot]):
            first += 1
        last -= 1
        while less(a[pivot], a[last]):
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _insertion_sort(a: list[T], first: int, last: int, less: Callable[[T, T], bool]) -> None:
    for i in range(first + 1, last):
        value = a[i]
        if less(value, a[first]):
            a[first + 1 : i + 1] = a[first:i]
            a[first] = value
        else:
            _unguarded_linear_insert(a, i, less)


def _unguarded_linear_insert(a: list[T], last: int, less: Callable[[T, T], bool]) -> None:
    value = a[last]
    nxt = last - 1
    while less(value, a[nxt]):
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = value


def _final_insertion_sort(a: list[T], first: int, last: int, less: Callable[[T, T], bool]) -> None:
    if last - first > _THRESHOLD:
        _insertion_sort(a, first, first + _THRESHOLD, less)
        for i in range(first + _THRESHOLD, last):
            _unguarded_linear_insert(a, i, less)
    else:
        _insertion_sort(a, first, last, less)


def _heap_sort(a: list[T], first: int, last: int, less: Callable[[T, T], bool]) -> None:
    # std::partial_sort(first, last, last): make_heap then sort_heap, as libstdc++ does.
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(a, first, parent, length, a[first + parent], less)
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        value = a[last]
        a[last] = a[first]
        _adjust_heap(a, first, 0, last - first, value, less)


def _adjust_heap(
    a: list[T], first: int, hole: int, length: int, value: T, less: Callable[[T, T], bool]
) -> None:
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if less(a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and less(a[first + parent], value):
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value


class _RehashPolicy(ctypes.Structure):
    _fields_ = [("max_load_factor", ctypes.c_float), ("next_resize", ctypes.c_size_t)]


class _RehashDecision(ctypes.Structure):
    _fields_ = [("needed", ctypes.c_bool), ("buckets", ctypes.c_size_t)]


@functools.cache
def _need_rehash() -> Any:
    """libstdc++'s own ``_Prime_rehash_policy::_M_need_rehash`` (its prime table and growth).

    It is an exported, non-inlined function of the very libstdc++ TVM runs on, so calling it
    gives the bucket counts TVM's hash maps go through without copying its tables here.
    """
    function = ctypes.CDLL("libstdc++.so.6")[
        "_ZNKSt8__detail20_Prime_rehash_policy14_M_need_rehashEmmm"
    ]
    function.restype = _RehashDecision
    function.argtypes = [
        ctypes.POINTER(_RehashPolicy),
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_size_t,
    ]
    return function


def unordered_map_order(hashes: Sequence[int]) -> list[int]:
    """Iteration order of a ``std::unordered_map`` after inserting keys with these hash codes.

    Keys are distinct and inserted in the given order; the result lists their indices in the
    order iteration visits them. This follows libstdc++'s ``_Hashtable``: one singly linked list
    of nodes, each bucket pointing at the node before its first, new nodes inserted at the front
    of their bucket, and a rehash that relinks the nodes bucket by bucket.
    """
    policy = _RehashPolicy(1.0, 0)
    bucket_count = 1
    following: dict[int, int | None] = {}
    head: int | None = None  # the sentinel's successor
    sentinel = -1
    before: list[int | None] = [None]  # per bucket: the node before its first node
    for node, code in enumerate(hashes):
        decision = _need_rehash()(ctypes.byref(policy), bucket_count, node, 1)
        if decision.needed:
            bucket_count = int(decision.buckets)
            before, head = _rehash(hashes, following, head, bucket_count, sentinel)
        bucket = code % bucket_count
        previous = before[bucket]
        if previous is None:
            following[node], head = head, node
            if following[node] is not None:
                before[hashes[following[node]] % bucket_count] = node  # type: ignore[index]
            before[bucket] = sentinel
        elif previous == sentinel:
            following[node], head = head, node
        else:
            following[node], following[previous] = following[previous], node
    order: list[int] = []
    cursor = head
    while cursor is not None:
        order.append(cursor)
        cursor = following[cursor]
    return order


def _rehash(
    hashes: Sequence[int],
    following: dict[int, int | None],
    head: int | None,
    bucket_count: int,
    sentinel: int,
) -> tuple[list[int | None], int | None]:
    before: list[int | None] = [None] * bucket_count
    cursor, head = head, None
    first_bucket = 0
    while cursor is not None:
        successor = following[cursor]
        bucket = hashes[cursor] % bucket_count
        previous = before[bucket]
        if previous is None:
            following[cursor], head = head, cursor
            before[bucket] = sentinel
            if following[cursor] is not None:
                before[first_bucket] = cursor
            first_bucket = bucket
        elif previous == sentinel:
            following[cursor], head = head, cursor
        else:
            following[cursor], following[previous] = following[previous], cursor
        cursor = successor
    return before, head
