"""How long a given-back message waits before its next delivery: ActiveMQ's redeliveryPolicy.

The n-th redelivery waits ``initial_redelivery_delay`` for n = 1, then ``redelivery_delay``
each time - or, with ``use_exponential_backoff``, the previous wait times
``backoff_multiplier`` - capped at ``maximum_redelivery_delay`` (0: no cap; a cap below
``redelivery_delay`` gives way to it, as in ActiveMQ). A function of n alone, so a restart
that kept the count keeps the back-off.
"""

from __future__ import annotations

from sluicemq.config import Policy

_MAX_STEPS = 64  # past this many redeliveries the wait has long reached its cap or overflowed
_MAX_MS = 10 * 365 * 24 * 3600 * 1000


def redelivery_delay(policy: Policy, redelivery: int) -> int:
    """Milliseconds before redelivery number ``redelivery`` (1 = the first); 0: at once."""
    if redelivery < 1:
        return 0
    delay = policy.initial_redelivery_delay
    for _ in range(1, min(redelivery, _MAX_STEPS)):
        nxt = policy.redelivery_delay
        if delay > 0 and policy.use_exponential_backoff and policy.backoff_multiplier > 1:
            nxt = int(delay * policy.backoff_multiplier)
        cap = policy.maximum_redelivery_delay
        if cap > 0 and nxt > cap:
            nxt = max(cap, policy.redelivery_delay)
        delay = min(nxt, _MAX_MS)
    return max(0, delay)
