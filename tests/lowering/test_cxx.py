"""The libstdc++ stand-ins, checked against the real library compiled here with g++."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from relay_tasks.lowering import cxx
from relay_tasks.lowering.cxx import hash_combine, std_hash_string, std_sort, unordered_map_order

_PROGRAM = r"""
#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>
static std::vector<unsigned long> codes;
struct ByCode {  // a key is an index; its hash is the code given for it
  size_t operator()(int i) const { return codes[i]; }
};
int main() {
  std::string mode;
  std::cin >> mode;
  if (mode == "map") {
    int n;
    while (std::cin >> n) {
      codes.assign(n, 0);
      for (int i = 0; i < n; ++i) std::cin >> codes[i];
      std::unordered_map<int, int, ByCode> map;
      for (int i = 0; i < n; ++i) map[i] = i;
      for (const auto& kv : map) std::cout << kv.first << " ";
      std::cout << "\n";
    }
  } else if (mode == "hash") {
    std::string line;
    std::getline(std::cin, line);
    while (std::getline(std::cin, line)) std::cout << std::hash<std::string>{}(line) << "\n";
  } else {
    int n;
    while (std::cin >> n) {
      std::vector<int> keys(n), idx(n);
      for (int i = 0; i < n; ++i) { std::cin >> keys[i]; idx[i] = i; }
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return keys[a] < keys[b]; });
      for (int i : idx) std::cout << i << " ";
      std::cout << "\n";
    }
  }
}
"""


@pytest.fixture(scope="module")
def libstdcxx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to check the libstdc++ stand-ins against the real library"
    folder = tmp_path_factory.mktemp("cxx")
    (folder / "probe.cc").write_text(_PROGRAM)
    subprocess.run(
        [compiler, "-O1", "-o", str(folder / "probe"), str(folder / "probe.cc")], check=True
    )
    return folder / "probe"


def _run(probe: Path, text: str) -> list[str]:
    done = subprocess.run([str(probe)], input=text, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_std_hash_matches_libstdcxx(libstdcxx: Path) -> None:
    rng = random.Random(0)
    words = ["", "a", "fused", "fused_nn.conv2d_add_nn.relu" * 4]
    words += [
        "".join(rng.choice("abc_.XYZ019") for _ in range(rng.randrange(1, 200))) for _ in range(200)
    ]
    expected = _run(libstdcxx, "hash\n" + "\n".join(words) + "\n")
    assert [str(std_hash_string(w)) for w in words] == expected


@pytest.mark.parametrize("size", [0, 1, 2, 15, 16, 17, 40, 75, 300])
def test_std_sort_matches_libstdcxx_including_ties(libstdcxx: Path, size: int) -> None:
    rng = random.Random(size)
    rows = [[rng.randrange(0, 6) for _ in range(size)] for _ in range(30)]
    rows.append(list(range(size, 0, -1)))  # reversed input: the partition's worst case
    text = "sort\n" + "".join(f"{len(r)} {' '.join(map(str, r))}\n" for r in rows)
    expected = _run(libstdcxx, text)
    for keys, line in zip(rows, expected, strict=True):
        ours = std_sort(range(len(keys)), lambda a, b, k=keys: k[a] < k[b])
        assert ours == [int(x) for x in line.split()]


def _quicksort_killer(size: int) -> list[int]:
    """Keys that drive this introsort to its depth limit (McIlroy's adversary, made concrete)."""
    gas = size
    keys = [gas] * size
    frozen = 0
    candidate = 0

    def less(x: int, y: int) -> bool:
        nonlocal frozen, candidate
        if keys[x] == gas and keys[y] == gas:
            keys[x if x == candidate else y] = frozen
            frozen += 1
        if keys[x] == gas:
            candidate = x
        elif keys[y] == gas:
            candidate = y
        return keys[x] < keys[y]

    std_sort(range(size), less)
    return keys


def test_std_sort_falls_back_to_heap_sort_like_libstdcxx(
    libstdcxx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _quicksort_killer(512)
    heap_sorts = []
    real_heap_sort = cxx._heap_sort
    monkeypatch.setattr(cxx, "_heap_sort", lambda *a: heap_sorts.append(1) or real_heap_sort(*a))
    ours = std_sort(range(len(keys)), lambda a, b: keys[a] < keys[b])
    assert heap_sorts, "the adversarial input no longer reaches the heap-sort fallback"
    (line,) = _run(libstdcxx, f"sort\n{len(keys)} {' '.join(map(str, keys))}\n")
    assert ours == [int(x) for x in line.split()]


def test_hash_combine_is_dmlc_formula() -> None:
    assert hash_combine(0, 0) == 0x9E3779B9
    assert hash_combine(1, 2) == 1 ^ (2 + 0x9E3779B9 + (1 << 6) + (1 >> 2))


@pytest.mark.parametrize("size", [0, 1, 2, 3, 12, 13, 29, 60, 97, 200, 500])
def test_unordered_map_order_matches_libstdcxx(libstdcxx: Path, size: int) -> None:
    """Iteration order after inserting keys with these hash codes, rehashes included: random
    64-bit codes (as TVM's compile-cache keys are) and codes that collide in small tables."""
    rng = random.Random(size)
    rows = [[rng.getrandbits(64) for _ in range(size)] for _ in range(10)]
    rows += [
        [rng.randrange(0, 7) * 13 + rng.randrange(0, 2) for _ in range(size)] for _ in range(5)
    ]
    text = "map\n" + "".join(f"{len(r)} {' '.join(map(str, r))}\n" for r in rows)
    expected = _run(libstdcxx, text)
    for codes, line in zip(rows, expected, strict=True):
        assert unordered_map_order(codes) == [int(x) for x in line.split()]
