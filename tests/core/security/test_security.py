"""Spec of security/policy.py: password hashes, ACL rules, login throttling, durable ownership."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from sluicemq.config import AclEntry, BrokerConfig, SecuritySettings, UserEntry
from sluicemq.core.security.policy import (
    ADMIN,
    ANONYMOUS,
    BROWSE,
    READ,
    WRITE,
    Acl,
    DurableOwners,
    LoginThrottle,
    Security,
    User,
    hash_password,
    verify_password,
)

APP_HASH = hash_password("app-secret")
ADMIN_HASH = hash_password("admin-secret")
APP = User("app", frozenset({"apps"}))
OPS = User("olga", frozenset({"admins"}))


def settings(**overrides: Any) -> SecuritySettings:
    base: dict[str, Any] = {"users": (UserEntry("app", APP_HASH, ("apps",)),
                      UserEntry("olga", ADMIN_HASH, ("admins",))),
            "login_failure_delay": 0.0}
    base.update(overrides)
    return SecuritySettings(**base)


# -- password hashes -------------------------------------------------------------------------
def test_hash_is_salted_argon2id_and_verifies() -> None:
    again = hash_password("app-secret")
    assert APP_HASH.startswith("$argon2id$")
    assert again != APP_HASH  # a fresh salt each time
    assert "app-secret" not in APP_HASH
    assert verify_password(APP_HASH, "app-secret")
    assert verify_password(again, "app-secret")


@pytest.mark.parametrize("password", ["", "app-secreT", "app-secret ", "app"])
def test_wrong_password_does_not_verify(password: str) -> None:
    assert not verify_password(APP_HASH, password)


@pytest.mark.parametrize("stored", ["", "plain", "$argon2id$garbage", "$2b$12$notbcrypt",
                                    "$argon2id$v=19$m=65536,t=3,p=4$\u2026"])  # non-ASCII
def test_malformed_hash_is_a_mismatch_not_an_exception(stored: str) -> None:
    assert not verify_password(stored, "anything")


# -- ACL -------------------------------------------------------------------------------------
ACL = Acl((
    AclEntry("/queue/orders.>", read=("apps",), write=("apps",), admin=("admins",)),
    AclEntry("/topic/prices.*", read=("*",), write=("olga",)),
    AclEntry("audit.>", read=("admins",), write=("*",)),
    AclEntry("/queue/public", read=("anonymous",), write=("anonymous",)),
    AclEntry(">", admin=("admins",)),
))


@pytest.mark.parametrize(("user", "action", "destination", "allowed"), [
    (APP, WRITE, "/queue/orders.eu", True),
    (APP, READ, "/queue/orders.eu.late", True),  # ">" spans any number of segments
    (APP, BROWSE, "/queue/orders.eu", True),  # browse needs read
    (APP, ADMIN, "/queue/orders.eu", False),
    (OPS, ADMIN, "/queue/orders.eu", True),  # via the rule and the ">" catch-all
    (OPS, READ, "/queue/orders.eu", False),  # admin does not imply read
    (APP, WRITE, "/queue/orders", True),  # ">" matches zero or more trailing segments
    (APP, WRITE, "/queue/ordersx", False),
    (APP, WRITE, "/topic/orders.eu", False),  # a /queue/ rule does not cover topics
    (APP, READ, "/topic/prices.eur", True),  # "*" principal: any authenticated user
    (APP, READ, "/topic/prices.eur.usd", False),  # "*" wildcard: exactly one segment
    (APP, WRITE, "/topic/prices.eur", False),
    (OPS, WRITE, "/topic/prices.eur", True),  # a user name as principal
    (APP, WRITE, "/queue/audit.x", True),  # a bare pattern covers both kinds
    (APP, WRITE, "/topic/audit.x", True),
    (APP, READ, "/topic/audit.x", False),
    (APP, READ, "/queue/unlisted", False),  # no rule matches: refused
    (ANONYMOUS, WRITE, "/queue/public", True),
    (ANONYMOUS, READ, "/topic/prices.x", True),  # "*" includes the anonymous user
    (ANONYMOUS, READ, "/queue/orders.eu", False),
    (APP, READ, "queue-without-prefix", False),
])
def test_acl_rules(user: User, action: str, destination: str, allowed: bool) -> None:
    assert ACL.allows(user, action, destination) is allowed


def test_broker_wide_admin_comes_only_from_a_catch_all_rule() -> None:
    assert ACL.allows(OPS, ADMIN, None)
    assert not ACL.allows(APP, ADMIN, None)
    only_orders = Acl((AclEntry("/queue/>", admin=("admins",)),))
    assert not only_orders.allows(OPS, ADMIN, None)


def test_no_rules_means_authentication_only() -> None:
    assert Acl(()).allows(APP, ADMIN, "/queue/anything")
    assert Acl(()).allows(ANONYMOUS, WRITE, "/topic/x")


def test_unknown_action_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        ACL.allows(APP, "delete", "/queue/orders.x")


# -- login throttle --------------------------------------------------------------------------
def test_throttle_blocks_an_address_after_max_failures_within_the_window() -> None:
    throttle = LoginThrottle(3, window=60)
    for t in (0, 1, 2):
        assert not throttle.blocked("10.0.0.1", t)
        throttle.failed("10.0.0.1", t)
    assert throttle.blocked("10.0.0.1", 3)
    assert not throttle.blocked("10.0.0.2", 3)  # per address
    assert not throttle.blocked("10.0.0.1", 61)  # old failures age out


def test_success_clears_an_address() -> None:
    throttle = LoginThrottle(2)
    throttle.failed("a", 0)
    throttle.succeeded("a")
    throttle.failed("a", 1)
    assert not throttle.blocked("a", 1)


# -- authentication --------------------------------------------------------------------------
def login(security: Security, login: str | None, passcode: str | None,
          peer: str = "10.1.1.1:5000", cert_user: str | None = None) -> tuple[User | None, str]:
    return asyncio.run(security.authenticate(login, passcode, peer, cert_user))


def test_good_password_yields_the_user_with_groups() -> None:
    user, reason = login(Security(settings()), "app", "app-secret")
    assert reason == ""
    assert user == APP


@pytest.mark.parametrize(("name", "password"), [("app", "wrong"), ("nobody", "app-secret"),
                                                ("app", ""), ("app", None), ("", "")])
def test_bad_credentials_are_refused_with_one_reason(name: str, password: str | None) -> None:
    user, reason = login(Security(settings()), name, password)
    assert user is None
    assert reason == "invalid login or passcode"  # same answer for unknown users


def test_anonymous_is_refused_once_users_exist() -> None:
    security = Security(settings())
    assert security.enabled and not security.anonymous_allowed
    assert login(security, None, None) == (None, "authentication required")


def test_anonymous_can_be_turned_on_beside_users() -> None:
    security = Security(settings(anonymous=True))
    assert login(security, None, None) == (None, "")
    assert login(security, "app", "wrong")[1]  # a wrong password is still refused


def test_open_broker_has_security_off() -> None:
    security = Security(SecuritySettings())
    assert not security.enabled
    assert security.authorize(None, WRITE, "/queue/x")


def test_anonymous_off_without_users_locks_everyone_out() -> None:
    security = Security(SecuritySettings(anonymous=False, login_failure_delay=0))
    assert security.enabled
    assert login(security, None, None)[0] is None


def test_certificate_cn_of_a_known_user_logs_in_without_passcode() -> None:
    security = Security(settings())
    assert login(security, None, None, cert_user="olga") == (OPS, "")
    assert login(security, "olga", None, cert_user="olga") == (OPS, "")
    assert login(security, None, None, cert_user="stranger")[0] is None
    # a certificate for one user does not vouch for another login name
    assert login(security, "app", None, cert_user="olga")[0] is None


def test_repeated_failures_from_one_address_are_refused_without_checking() -> None:
    security = Security(settings(max_login_failures=3))

    async def scenario() -> list[str]:
        reasons = []
        for _ in range(4):
            reasons.append((await security.authenticate("app", "guess", "10.9.9.9:1"))[1])
        reasons.append((await security.authenticate("app", "app-secret", "10.9.9.9:2"))[1])
        other = await security.authenticate("app", "app-secret", "10.8.8.8:1")
        reasons.append(other[1])
        return reasons

    reasons = asyncio.run(scenario())
    assert reasons[:3] == ["invalid login or passcode"] * 3
    assert reasons[3] == reasons[4] == "too many failed logins; try again later"
    assert reasons[5] == ""  # other addresses are unaffected


def test_begin_login_reports_a_refusal_only_after_the_delay() -> None:
    security = Security(settings(login_failure_delay=0.3))

    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        results: dict[str, float] = {}
        done = asyncio.Event()
        start = loop.time()

        def finished(key: str) -> None:
            results[key] = loop.time() - start
            if len(results) == 2:
                done.set()

        security.begin_login("app", "wrong", "1.2.3.4:1", None, lambda u, r: finished("bad"))
        security.begin_login("app", "app-secret", "1.2.3.5:1", None,
                             lambda u, r: finished("good"))
        await asyncio.wait_for(done.wait(), 10)
        return results["good"], results["bad"]

    good, bad = asyncio.run(scenario())
    assert bad >= 0.3
    assert good < bad


def test_http_basic_auth_uses_the_same_users() -> None:
    security = Security(settings())

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    run = asyncio.run
    assert run(security.authenticate_basic(basic("olga:admin-secret"), "h:1")) == (OPS, "")
    assert run(security.authenticate_basic(basic("olga:nope"), "h:1"))[0] is None
    assert run(security.authenticate_basic(basic("no-colon"), "h:1"))[0] is None
    assert run(security.authenticate_basic("Basic !!!", "h:1"))[0] is None
    assert run(security.authenticate_basic(None, "h:1")) == (None, "authentication required")


# -- durable subscription ownership ----------------------------------------------------------
def test_durable_belongs_to_its_first_authenticated_user_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "owners.json"
    owners = DurableOwners(path)
    assert owners.claim("d:c1:sub", APP)
    assert owners.claim("d:c1:sub", APP)
    assert not owners.claim("d:c1:sub", OPS)
    assert not owners.claim("d:c1:sub", None)
    reopened = DurableOwners(path)
    assert reopened.owner("d:c1:sub") == "app"
    assert not reopened.claim("d:c1:sub", OPS)
    reopened.release("d:c1:sub")
    assert DurableOwners(path).claim("d:c1:sub", OPS)


def test_anonymous_durables_stay_unowned(tmp_path: Path) -> None:
    owners = DurableOwners(tmp_path / "owners.json")
    assert owners.claim("d:c:s", None)
    assert owners.owner("d:c:s") is None
    assert not (tmp_path / "owners.json").exists()


def test_a_corrupt_owners_file_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "owners.json"
    path.write_text("{not json")
    assert DurableOwners(path).owner("d:c:s") is None


# -- configuration ---------------------------------------------------------------------------
def test_security_section_loads_users_and_rules(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f'''
[security]
login-failure-delay = 0.5

[[security.users]]
name = "app"
password = "{APP_HASH}"
groups = ["apps"]

[[security.acl]]
destination = "/queue/orders.>"
read = ["apps"]
write = ["apps"]
admin = ["admins"]

[limits]
max-connections = 50
max-subscriptions = 5
''')
    cfg = BrokerConfig.load(path)
    assert cfg.security.users == (UserEntry("app", APP_HASH, ("apps",)),)
    assert cfg.security.acl == (AclEntry("/queue/orders.>", ("apps",), ("apps",),
                                         ("admins",)),)
    assert cfg.security.login_failure_delay == 0.5
    assert cfg.limits.max_connections == 50
    assert cfg.limits.max_subscriptions == 5


def test_plain_text_passwords_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[[security.users]]\nname = "app"\npassword = "hunter2"\n')
    with pytest.raises(ValueError, match="sluice passwd"):
        BrokerConfig.load(path)


def test_unknown_security_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[[security.acl]]\ndestination = ">"\ndelete = ["x"]\n')
    with pytest.raises(ValueError, match="delete"):
        BrokerConfig.load(path)


def test_failures_are_counted_per_address_and_login_name() -> None:
    """Anonymous or other-name failures from an address never lock out a user there."""
    security = Security(settings(max_login_failures=3))

    async def scenario() -> list[str]:
        reasons = [(await security.authenticate(None, None, "10.7.7.7:1"))[1] for _ in range(5)]
        reasons += [(await security.authenticate("olga", "guess", "10.7.7.7:2"))[1]
                    for _ in range(4)]
        reasons.append((await security.authenticate("app", "app-secret", "10.7.7.7:3"))[1])
        return reasons

    reasons = asyncio.run(scenario())
    assert reasons[8] == "too many failed logins; try again later"  # olga's 4th, unchecked
    assert reasons[9] == ""  # app from the same address gets in


def test_concurrent_guesses_get_no_more_checks_than_the_limit() -> None:
    """Checks in progress count as failures: 50 guesses at once, 3 checked, the rest refused
    unchecked; the right password for another user still gets in meanwhile."""
    security = Security(settings(max_login_failures=3))

    async def scenario() -> tuple[list[str], str]:
        guesses = [security.authenticate("olga", f"guess{i}", "10.6.6.6:1") for i in range(50)]
        both = await asyncio.gather(security.authenticate("app", "app-secret", "10.6.6.6:2"),
                                    *guesses)
        return [reason for _user, reason in both[1:]], both[0][1]

    reasons, legit = asyncio.run(scenario())
    assert reasons.count("invalid login or passcode") == 3
    assert reasons.count("too many failed logins; try again later") == 47
    assert legit == ""


def test_unknown_names_are_refused_like_wrong_passwords() -> None:
    security = Security(settings(max_login_failures=100))
    assert login(security, "nobody", "x") == (None, "invalid login or passcode")
    assert login(security, "nobody", "x", peer="10.5.5.5:1")[1] == "invalid login or passcode"


def test_a_dead_letter_queue_grants_what_its_origin_grants() -> None:
    """Readers of orders.> read DLQ.orders.*; rules naming the DLQ add to that; off, a DLQ has
    only its own rules."""
    acl = Acl((AclEntry("/queue/orders.>", read=("apps",)),
               AclEntry("/topic/news.>", read=("apps",)),
               AclEntry("/queue/DLQ.special", read=("olga",))), dlq_prefixes=("DLQ.",))
    assert acl.allows(APP, READ, "/queue/DLQ.orders.eu")
    assert acl.allows(APP, READ, "/queue/DLQ.news.eu")  # a topic subscription's DLQ
    assert not acl.allows(APP, WRITE, "/queue/DLQ.orders.eu")  # only what the origin grants
    assert not acl.allows(APP, READ, "/queue/DLQ.payroll")
    assert not acl.allows(APP, READ, "/queue/DLQ.")
    assert acl.allows(OPS, READ, "/queue/DLQ.special")
    strict = Acl(acl.entries)
    assert not strict.allows(APP, READ, "/queue/DLQ.orders.eu")


def test_a_reconnect_storm_shares_one_check() -> None:
    """Thirty connections of one user from one address at once, before any was verified: one
    check answers them all, so none is mistaken for a burst of guesses."""
    security = Security(settings(max_login_failures=3))

    async def scenario() -> list[str]:
        storm = [security.authenticate("app", "app-secret", f"10.4.4.4:{i}") for i in range(30)]
        return [reason for _user, reason in await asyncio.gather(*storm)]

    assert asyncio.run(scenario()) == [""] * 30
