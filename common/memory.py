"""How a long-running process asks glibc's allocator to give big buffers back.

glibc serves an allocation of 128 KiB or more with its own mmap and unmaps it when freed, until
the first such block is freed: from then on it raises that threshold to the freed block's size
(up to 32 MiB) and carves big blocks from its heaps instead. A worker sees a megabyte-long
message now and then (a bad event is dead-lettered whole, librdkafka fetches it), and those
blocks, carved between small long-lived ones, leave holes no later block fits: in one soak of
the chaos suite, a worker without this ran at 197-219 MiB and grew in steps, one with it at
109-152 MiB. Fixing the threshold at glibc's own default
turns the raising off, so every big buffer is unmapped when freed. A process on another libc
(musl, macOS) keeps its allocator's own behaviour."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # malloc.h
MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept fixed
ENV_OVERRIDE = "MALLOC_MMAP_THRESHOLD_"  # glibc's own tunable: an operator's choice wins


def keep_big_buffers_unmapped() -> bool:
    """Fix glibc's mmap threshold (module docstring); True when it was set here."""
    if ENV_OVERRIDE in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
