"""Scheduled delivery: messages held until their time (ActiveMQ's AMQ_SCHEDULED_* headers)."""
