"""glibc's mmap threshold fixed (common/memory.py): a freed megabyte block no longer moves the
next ones onto the heap. Each case runs in a fresh interpreter, its allocator untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import ctypes, sys
from common.memory import keep_big_buffers_unmapped
if sys.argv[1] == "fixed":
    print(keep_big_buffers_unmapped())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
for _ in range(2):  # a megabyte block allocated and freed, twice
    block = libc.malloc(1 << 20)
    mapped = bool(ctypes.c_size_t.from_address(block - 8).value & 2)  # glibc's IS_MMAPPED bit
    libc.free(block)
print(mapped)
"""

glibc = pytest.mark.skipif(not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc's allocator only")


def _probe(mode: str, env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=True)  # fmt: skip
    return done.stdout.split()


@glibc
def test_a_freed_megabyte_leaves_the_next_one_on_the_heap_by_default() -> None:
    assert _probe("default") == ["False"]  # what the fix is for: glibc raised its threshold


@glibc
def test_with_the_threshold_fixed_every_megabyte_block_is_mapped_and_given_back() -> None:
    assert _probe("fixed") == ["True", "True"]


@glibc
def test_an_operators_own_threshold_wins() -> None:
    assert _probe("fixed", {"MALLOC_MMAP_THRESHOLD_": "4194304"}) == ["False", "False"]
