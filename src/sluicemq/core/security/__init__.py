"""Security: who may connect and what they may touch.

Owns hashed users, ActiveMQ-style ACLs, the login throttle and durable-subscription owners.
May import config and errors.
"""
