"""Bit-exact stand-ins for the few C++ standard-library behaviours that show in upstream's output.

Upstream's task names, task order and Ansor's task order are shaped by libstdc++ details: the
``std::hash<std::string>`` that shortens long fused names, the unstable ``std::sort`` that orders
MetaSchedule's anchor-block tasks, and the iteration order of ``std::unordered_map``. To equal
upstream exactly we reproduce those algorithms here, each checked against upstream in the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

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
