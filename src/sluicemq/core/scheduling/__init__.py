"""Scheduling: messages held until their time (ActiveMQ's AMQ_SCHEDULED_* headers).

Owns the calendar of far and near due times, cron expressions, redelivery delays and the
scheduler that moves a message to its destination when it falls due. May import routing
(names, keys, the in-memory message) and streams.
"""
