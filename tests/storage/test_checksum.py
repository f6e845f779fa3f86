"""Spec of the journal's CRC-32: a large record's body may be checksummed ahead.

``Journal.append`` checksums a large tail on the appending thread, before the record's
segment (whose seed starts the record's CRC) is known; the writer combines that CRC with its
header's. The record must carry the very checksum it would have had computed whole.
"""

from __future__ import annotations

import random

import pytest

from sluicemq.storage.checksum import crc32, crc32_combine
from sluicemq.storage.journal_writer import TAIL_CRC_AHEAD
from sluicemq.storage.segment import encode_header

pytestmark = pytest.mark.skipif(crc32_combine is None, reason="zlib-ng's combine is missing")


@pytest.mark.parametrize("seed", [0, 1, 0xFFFFFFFF, 0x12345678])
def test_combining_the_crcs_of_two_parts_gives_the_crc_of_the_whole(seed: int) -> None:
    rng = random.Random(seed)
    for size_a, size_b in [(0, 5), (7, 0), (150, 1 << 20), (4093, 70_001)]:
        a, b = rng.randbytes(size_a), rng.randbytes(size_b)
        assert crc32_combine is not None
        assert crc32_combine(crc32(a, seed), crc32(b), len(b)) == crc32(a + b, seed)


@pytest.mark.parametrize("seeds", [(0, 0), (0xDEADBEEF, 0x0BADF00D)])
def test_a_header_with_the_tail_checksummed_ahead_is_the_header_computed_whole(
        seeds: tuple[int, int]) -> None:
    rng = random.Random(7)
    head, tail = rng.randbytes(180), rng.randbytes(TAIL_CRC_AHEAD + 3)
    whole = encode_header(1, head, 4, 8192, tail, seeds=seeds)
    assert encode_header(1, head, 4, 8192, tail, seeds=seeds, tail_crc=crc32(tail)) == whole
    other = encode_header(1, head, 4, 8192, tail, seeds=seeds, tail_crc=crc32(tail[:-1] + b"?"))
    assert other != whole  # (the CRC given is the one used)
