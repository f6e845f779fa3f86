"""The broker's core, sans-IO: one package per concept.

routing (destinations, queues, topics, dispatch), paging (cursors in bounded memory), replay
(range reads, ledgers), staging (exactly-once staged publication), persistence (recovery and
snapshots), dedup (producer duplicate detection), streams (large chunked streams), sessions
(one connection's STOMP conversation), security (users, ACLs), limits (per-client limits) and
selectors (JMS selectors, a pure leaf). Nothing here opens a socket; transport/ drives it.
"""
