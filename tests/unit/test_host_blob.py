"""Saved-prefix blobs give their memory back to the OS when freed (`memory.host_blob`)."""

import sys

import numpy as np
import psutil
import pytest

from backends.llamacpp.memory import host_blob

MiB = 1 << 20


def _rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap behaviour")
def test_freed_blobs_leave_rss_although_a_later_one_lives():
    # A large free raises glibc's mmap threshold, so 5 MiB from malloc now comes from the heap,
    # where the freed blobs below the one that lives would stay resident.
    np.ones(8 * MiB, dtype=np.uint8)
    blobs = [host_blob(5 * MiB) for _ in range(40)]
    for b in blobs:
        b[:] = 1
    held = _rss()
    del b
    keep = blobs[-1]
    del blobs
    freed_mib = (held - _rss()) / MiB
    assert freed_mib > 180, f"only {freed_mib:.0f} MiB of 195 returned"
    assert keep.flags.writeable and int(keep[-1]) == 1


def test_empty_blob():
    assert host_blob(0).shape == (0,)
