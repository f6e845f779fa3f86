"""Operating the broker: web console, JSON admin API, Prometheus metrics.

Everything here runs on the broker's event loop and reads broker state directly, at request or
scrape time, so the messaging hot path carries no extra counters for it.
"""
