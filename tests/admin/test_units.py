"""Sans-IO pieces of the console: rate sampling, stream rates, fsync histogram, previews."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sluicemq.admin.sampler import FsyncHistogram, RateSampler, StreamRates
from sluicemq.admin.snapshot import body_preview


@dataclass(eq=False)
class FakeSession:
    delivered: int = 0


def test_rates_come_from_counter_growth_between_samples() -> None:
    sampler = RateSampler()
    a, b = FakeSession(), FakeSession()
    assert sampler.sample(0.0, 0, [a, b]) is None  # the first sample only sets a baseline
    a.delivered, b.delivered = 4, 6
    point = sampler.sample(2.0, 30, [a, b])
    assert point is not None and (point.msgs_in, point.msgs_out) == (15.0, 5.0)
    assert (sampler.total_in, sampler.total_out) == (30, 10)


def test_a_closed_session_still_counts_what_it_delivered_before_closing() -> None:
    sampler = RateSampler()
    s = FakeSession()
    sampler.sample(0.0, 0, [s])
    s.delivered = 7
    sampler.sample(1.0, 0, [])  # gone from the live set, its final counts still count
    assert sampler.total_out == 7


def test_deleted_destinations_do_not_make_rates_negative() -> None:
    sampler = RateSampler()
    sampler.sample(0.0, 100, [])
    point = sampler.sample(1.0, 40, [])
    assert point is not None and point.msgs_in == 0 and sampler.total_in == 0


def test_the_history_is_a_bounded_ring_and_series_cuts_by_time() -> None:
    sampler = RateSampler(history=5)
    for t in range(10):
        sampler.sample(float(t), t, [])
    assert len(sampler.points) == 5
    assert [p.t for p in sampler.series(2.5)] == [7.0, 8.0, 9.0]


@dataclass
class FakeStream:
    id: str
    destination: str = "/queue/files"
    received_bytes: int = 0
    delivered_bytes: int = 0


def test_stream_rates_average_over_a_window() -> None:
    rates = StreamRates(window=2)
    st = FakeStream("s1")
    namesake = FakeStream("s1", destination="/queue/other")  # same id, another destination
    assert rates.rates(st) == (0.0, 0.0)
    for t in range(4):
        st.received_bytes, st.delivered_bytes = 100 * t, 50 * t
        rates.sample(float(t), [st, namesake])
    assert rates.rates(st) == (100.0, 50.0)
    assert rates.rates(namesake) == (0.0, 0.0)
    rates.sample(5.0, [])
    assert rates.rates(st) == (0.0, 0.0)  # finished streams are forgotten


@dataclass
class FakeJournalStats:
    batches: int = 0
    fsync_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=4))


def test_fsync_histogram_is_cumulative_though_the_journal_keeps_few_samples() -> None:
    stats = FakeJournalStats()
    hist = FsyncHistogram(bounds=(0.001, 0.01))
    stats.fsync_latency_s.extend([0.0005, 0.002])
    stats.batches = 2
    hist.fold(stats)
    stats.fsync_latency_s.extend([0.02, 0.0001, 0.003])  # the deque drops the oldest
    stats.batches = 5
    hist.fold(stats)
    hist.fold(stats)  # nothing new: nothing counted twice
    assert hist.buckets() == [("0.001", 2), ("0.01", 4), ("+Inf", 5)]
    assert abs(hist.total - 0.0256) < 1e-9


def test_previews_show_text_as_text_and_binary_as_hex() -> None:
    assert body_preview(b"hello") == ("hello", False)
    assert body_preview("héllo wörld".encode(), limit=2) == ("h", False)  # é cut in half
    text, binary = body_preview(b"\x00\xff\x10")
    assert binary and text == "00 ff 10"
