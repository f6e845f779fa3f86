"""/metrics: a Prometheus collector that reads broker state at scrape time.

Nothing is counted per message for it: depths and totals come from the queues' own stats,
journal figures from the journal's stats, rates from the console's once-a-second sampler.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sluicemq.admin.process import broker_memory_limit, rss_bytes
from sluicemq.admin.snapshot import configured_limits, user_shares_view

if TYPE_CHECKING:
    from sluicemq.admin.context import AdminContext

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_DESTINATIONS = 500  # destinations with series of their own; the rest are summed
_STAT_FIELDS = ("enqueued", "dequeued", "redelivered", "expired", "dead_lettered")


class BrokerCollector(Collector):
    """Per-destination, journal, connection, memory and stream families for one broker."""

    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        yield from self._destinations()
        yield from self._journal()
        yield from self._process()
        yield from self._flow()
        yield from self._users()
        yield from self._pipelines()

    def _destinations(self) -> Iterator[Metric]:
        broker = self.ctx.broker
        labels = ["kind", "name"]
        depth = GaugeMetricFamily("sluice_destination_depth",
                                  "Messages waiting or in flight", labels=labels)
        consumers = GaugeMetricFamily("sluice_destination_consumers", "Attached consumers",
                                      labels=labels)
        memory = GaugeMetricFamily("sluice_destination_memory_bytes",
                                   "Body bytes held in memory", labels=labels)
        paged = GaugeMetricFamily("sluice_destination_paged_messages",
                                  "Messages whose bodies are only in the journal or temp "
                                  "files (store/file cursor)", labels=labels)
        lag = GaugeMetricFamily("sluice_destination_consumer_lag_bytes",
                                "Body bytes the consumers are behind (producer pacing holds "
                                "SENDs past the policy's max_consumer_lag; 0: no consumer)",
                                labels=labels)
        counters = {field: CounterMetricFamily(f"sluice_destination_{field}",
                                               f"Messages {field} since broker start",
                                               labels=labels)
                    for field in ("enqueued", "dequeued", "redelivered", "expired",
                                  "dead_lettered")}
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            depth, consumers, memory, paged, lag, *counters.values()]
        for lv, values in _destination_rows(broker):
            for family, value in zip(families, values, strict=True):
                family.add_metric(lv, value)
        yield from families
        yield from self._limits()

        sampler = self.ctx.sampler
        yield CounterMetricFamily("sluice_messages_received", "Messages sent by producers",
                                  value=sampler.total_in)
        yield CounterMetricFamily("sluice_messages_delivered", "MESSAGE frames to consumers",
                                  value=sampler.total_out)
        by_transport: dict[str, int] = {"tcp": 0, "websocket": 0}
        for _, transport in self.ctx.connections():
            by_transport[transport] = by_transport.get(transport, 0) + 1
        yield _by_label("sluice_connections", "Open client connections", "transport",
                        sorted(by_transport.items()))
        yield GaugeMetricFamily("sluice_output_buffered_bytes",
                                "Bytes written to peers, not yet taken by their sockets "
                                "(limit output_buffer_bytes)",
                                value=sum(getattr(s.out, "buffered", 0)
                                          for s, _ in self.ctx.connections()))
        yield GaugeMetricFamily("sluice_connection_memory_bytes",
                                "Open connections' own state (TCP and WebSocket), charged to "
                                "memory_limit (with destinations' at most the part store "
                                "cursors leave)", value=broker.memory.connections)
        yield GaugeMetricFamily("sluice_destinations_memory_bytes",
                                "Destinations' and durable subscriptions' own state, charged "
                                "to memory_limit", value=broker.memory.objects)
        yield GaugeMetricFamily("sluice_durable_subscriptions", "Durable topic subscriptions",
                                value=len(broker.durables))
        by_state: dict[str, int] = {}
        for st in (getattr(broker, "streams", None) or {}).values():
            by_state[st.state] = by_state.get(st.state, 0) + 1
        yield _by_label("sluice_streams", "Large streams by state", "state",
                        ((state, by_state.get(state, 0)) for state in
                         ("receiving", "dispatching", "resumed", "abandoned", "complete")))
        yield GaugeMetricFamily(
            "sluice_streams_in_progress", "Streams receiving, dispatching or resumed",
            value=sum(by_state.get(s, 0) for s in ("receiving", "dispatching", "resumed")))

    def _limits(self) -> Iterator[Metric]:
        """Counts against the connection and destination caps (what a hostile client fills)."""
        broker = self.ctx.broker
        limits = broker.config.limits
        admission, budget = broker.admission, broker.destinations
        counted = (("max_connections", limits.max_connections, admission.total),
                   ("max_connections_per_address", limits.max_connections_per_address,
                    admission.busiest()),
                   ("max_destinations", limits.max_destinations, budget.count),
                   ("max_destinations_per_user", limits.max_destinations_per_user,
                    max(budget.per_owner.values(), default=0)))
        yield _by_label("sluice_limit", "Every [limits] setting (counts, bytes, seconds)",
                        "limit", configured_limits(broker).items())
        yield _by_label("sluice_limit_used", "What is used of each [limits] cap now", "limit",
                        ((name, now) for name, _, now in counted))
        yield GaugeMetricFamily("sluice_consumer_waits",
                                "SENDs waiting for a destination to have a consumer",
                                value=len(broker.consumer_waits))
        yield CounterMetricFamily("sluice_connections_refused",
                                  "Connections refused at a connection cap",
                                  value=admission.refused_total)
        yield CounterMetricFamily("sluice_destinations_refused",
                                  "Destinations refused at a destination cap",
                                  value=budget.refused_total)
        yield CounterMetricFamily("sluice_destinations_reclaimed",
                                  "Idle empty destinations dropped",
                                  value=budget.reclaimed_total)
        yield CounterMetricFamily("sluice_turns_deferred",
                                  "Inputs that waited for a later event-loop turn "
                                  "(turn_budget_ms spent)", value=broker.turns.deferred_total)
        yield GaugeMetricFamily("sluice_turns_waiting",
                                "Connections waiting for an event-loop turn now",
                                value=len(broker.turns))

    def _journal(self) -> Iterator[Metric]:
        store = self.ctx.store
        if store is None:
            return
        journal = store.journal
        js = journal.stats
        yield GaugeMetricFamily("sluice_journal_disk_bytes",
                                "Bytes of live journal segment files", value=journal.disk_bytes())
        yield GaugeMetricFamily("sluice_journal_spare_bytes",
                                "Bytes of reclaimed segment files kept for reuse",
                                value=journal.pool.spare_bytes)
        yield CounterMetricFamily("sluice_journal_spares_released",
                                  "Kept files deleted since start to give their room back "
                                  "(store limit, free-space floor)",
                                  value=journal.pool.released)
        yield CounterMetricFamily("sluice_journal_segments_reused",
                                  "Segments made from a kept file since start",
                                  value=journal.pool.taken)
        yield CounterMetricFamily("sluice_journal_written_bytes", "Bytes appended to the journal",
                                  value=js.bytes)
        yield CounterMetricFamily("sluice_journal_direct_bytes",
                                  "Bytes of large records written with O_DIRECT (0 where the "
                                  "filesystem refuses it)", value=js.direct_bytes)
        yield CounterMetricFamily("sluice_journal_records", "Records made durable",
                                  value=js.records)
        yield CounterMetricFamily("sluice_journal_fsyncs", "fdatasync calls", value=js.fsyncs)
        yield CounterMetricFamily("sluice_journal_batches", "Group commits", value=js.batches)
        yield CounterMetricFamily("sluice_journal_failures", "Group commits that failed",
                                  value=js.failures)
        later = self.ctx.broker.later
        yield _by_label("sluice_store_later_messages", "Persistent messages dispatched before "
                        "their write (concurrent store and dispatch): deferred, acknowledged "
                        "first (never written), written when due", "outcome",
                        (("deferred", later.deferred), ("acknowledged", later.skipped),
                         ("written", later.stored)))
        yield _by_label("sluice_journal_batch_records", "Records per group commit", "stat",
                        (("last", js.last_batch), ("max", js.max_batch),
                         ("mean", js.mean_batch)))
        h = self.ctx.fsync
        yield HistogramMetricFamily("sluice_journal_fsync_seconds",
                                    "fdatasync latency per group commit",
                                    buckets=h.buckets(), sum_value=h.total)

    def _flow(self) -> Iterator[Metric]:
        flow = self.ctx.broker.flow
        usage = flow.usage()
        yield _by_label("sluice_limit_used_bytes", "Bytes used of each broker-wide limit",
                        "limit", ((name, u["used"]) for name, u in usage.items()))
        yield _by_label("sluice_limit_bytes", "Broker-wide limits (memory for queued "
                        "messages, journal store, temp files)", "limit",
                        ((name, u["limit"]) for name, u in usage.items()))
        yield GaugeMetricFamily("sluice_flow_producers_waiting",
                                "SENDs held by producer flow control now", value=flow.waiting)
        yield CounterMetricFamily("sluice_flow_blocked", "SENDs that had to wait for room",
                                  value=flow.blocked_total)
        yield CounterMetricFamily("sluice_flow_refused",
                                  "SENDs refused for lack of room (fail_if_no_space)",
                                  value=flow.failed_total)
        yield CounterMetricFamily("sluice_flow_paced",
                                  "SENDs held because the destination's consumers were behind "
                                  "(max_consumer_lag)", value=flow.paced_total)
        yield CounterMetricFamily("sluice_heap_trims",
                                  "times freed heap was handed back to the OS after a drain",
                                  value=flow.trimmer.trims)

    def _users(self) -> Iterator[Metric]:
        """Each login's share of the store (only while ``user_store_limit`` keeps one)."""
        users = user_shares_view(self.ctx.broker)["users"]
        yield _by_label("sluice_user_store_bytes", "Body bytes of persistent messages each "
                        "user has stored (user_store_limit bounds it)", "user",
                        ((u["user"], u["bytes"]) for u in users))
        yield _by_label("sluice_user_store_messages", "Persistent messages each user has "
                        "stored", "user", ((u["user"], u["messages"]) for u in users))

    def _pipelines(self) -> Iterator[Metric]:
        """Staged publishing and producer duplicate detection (docs/replay-protocol.md)."""
        stager, producers = self.ctx.broker.stager, self.ctx.broker.producers
        yield GaugeMetricFamily("sluice_stage_parked_parts",
                                "Staged parts waiting for publication", value=stager.parked_parts)
        yield GaugeMetricFamily("sluice_stage_remembered_batches",
                                "Published (sink, batch) ids remembered for idempotency",
                                value=stager.book.remembered)
        yield CounterMetricFamily("sluice_stage_published_batches",
                                  "Batches published since broker start",
                                  value=stager.published_batches)
        yield CounterMetricFamily("sluice_stage_published_messages",
                                  "Messages made visible by publications",
                                  value=stager.published_messages)
        yield CounterMetricFamily("sluice_stage_discarded_parts",
                                  "Staged parts discarded (unlisted, aborted, expired)",
                                  value=stager.discarded_parts)
        yield GaugeMetricFamily("sluice_producer_ids", "Producer ids in the duplicate table",
                                value=len(producers.table))
        yield CounterMetricFamily("sluice_producer_duplicates",
                                  "Numbered SENDs dropped as duplicates since broker start",
                                  value=producers.table.duplicates)

    def _process(self) -> Iterator[Metric]:
        limit, source = broker_memory_limit(self.ctx.broker)
        yield GaugeMetricFamily("sluice_memory_rss_bytes", "Broker process resident memory",
                                value=rss_bytes())
        if limit is not None:
            lim = GaugeMetricFamily("sluice_memory_limit_bytes", "Memory ceiling",
                                    labels=["source"])
            lim.add_metric([source], limit)
            yield lim


def _by_label(name: str, documentation: str, label: str,
              values: Iterable[tuple[str, float]]) -> GaugeMetricFamily:
    """A gauge family with one series per value of its one label."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in values:
        family.add_metric([key], value)
    return family


Row = tuple[list[str], list[int]]


def _destination_rows(broker: Any) -> list[Row]:
    """(kind, name) labels and values per destination: the ``METRICS_DESTINATIONS`` deepest
    each on their own, the rest summed per kind under the name ``(other)``.

    Why: with tens of thousands of destinations, a series each made one scrape take seconds
    of the event loop that serves every client.
    """
    rows: list[Row] = []
    for name, q in broker.queues.items():
        rows.append((["queue", name], [q.depth(), len(q.consumers), q.pending.bytes,
                                       q.pending.paged, q.lag() if q.consumers else 0,
                                       *(getattr(q.stats, f) for f in _STAT_FIELDS)]))
    for name, t in broker.topics.items():
        subs = list(t.subscribers.values())
        rows.append((["topic", name], [
            sum(q.depth() for q in subs), sum(len(q.consumers) for q in subs),
            sum(q.pending.bytes for q in subs), sum(q.pending.paged for q in subs),
            min((q.lag() for q in subs if q.consumers), default=0), t.published,
            *(sum(getattr(q.stats, f) for q in subs) for f in _STAT_FIELDS[1:])]))
    if len(rows) <= METRICS_DESTINATIONS:
        return rows
    kept = heapq.nlargest(METRICS_DESTINATIONS, rows, key=lambda row: row[1][0])
    chosen = {id(row) for row in kept}
    other: dict[str, list[int]] = {}
    for row in rows:
        if id(row) in chosen:
            continue
        total = other.setdefault(row[0][0], [0] * len(row[1]))
        for i, v in enumerate(row[1]):
            total[i] += v
    return kept + [([kind, "(other)"], values) for kind, values in sorted(other.items())]


def make_registry(ctx: AdminContext) -> CollectorRegistry:
    """A private registry: our collector plus the standard process_* families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(ctx))
    registry.register(ProcessCollector(registry=None))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
