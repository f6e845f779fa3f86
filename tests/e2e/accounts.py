"""Users and ACL rules for the security specs: one way to write a `[security]` section.

Each spec module names its users (password and groups) and its rules; this module hashes the
passwords once, writes the TOML a broker reads, and logs a client in as one of them.
"""

from __future__ import annotations

from typing import Any

from sluicemq.client import Client
from sluicemq.core.security.policy import hash_password


class Accounts:
    """Named users (``{name: (password, groups)}``) and the broker config that holds them."""

    def __init__(self, users: dict[str, tuple[str, list[str]]]) -> None:
        self.users = users
        self._hashes = {name: hash_password(pw) for name, (pw, _groups) in users.items()}

    def password(self, user: str) -> str:
        return self.users[user][0]

    def config(self, rules: str, *, delay: float, max_failures: int, extra: str = "") -> str:
        """A `[security]` section with these users, then ``rules`` (`[[security.acl]]` tables).

        ``delay`` is login-failure-delay and ``max_failures`` max-login-failures; ``extra``
        adds more `[security]` keys.
        """
        users = "".join(f'[[security.users]]\nname = "{name}"\npassword = "{digest}"\n'
                        f"groups = {self.users[name][1]!r}\n".replace("'", '"')
                        for name, digest in self._hashes.items())
        return (f"\n[security]\nlogin-failure-delay = {delay}\n"
                f"max-login-failures = {max_failures}\n{extra}\n\n{users}{rules}")

    def login(self, broker: Any, user: str, **kwargs: Any) -> Client:
        """A connected client logged in as ``user``."""
        return Client(broker.url, login=user, passcode=self.password(user), timeout=10, **kwargs)


# Two users who may each write only their own namespace: mallory /queue/m.>, alice /queue/a.>
# (the specs of what one user can do to another's data through the broker).
NEIGHBOURS = Accounts({"mallory": ("m-pw", ["m"]), "alice": ("a-pw", ["a"])})
NEIGHBOUR_RULES = """
[[security.acl]]
destination = "/queue/m.>"
read = ["m"]
write = ["m"]

[[security.acl]]
destination = "/queue/a.>"
read = ["a"]
write = ["a"]
"""
