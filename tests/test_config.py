"""config.py against the README: every TOML block a user copies loads, and the blocks that say
"defaults shown" show config.py's defaults (a changed default must change the README too)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from sluicemq.config import (
    AdvisorySettings,
    BrokerConfig,
    HaSettings,
    JournalSettings,
    Limits,
    Policy,
    SchedulerSettings,
    VirtualTopics,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)


def block_starting(first_lines: str) -> str:
    found = [b for b in toml_blocks() if b.startswith(first_lines)]
    assert len(found) == 1, f"one README toml block starting {first_lines!r}, found {len(found)}"
    return found[0]


def load(text: str, tmp_path: Path) -> BrokerConfig:
    """What `sluice broker --config` reads, with the README's placeholders filled in as its
    text tells a user to: a hash from `sluice passwd`, certificate files that exist."""
    text = text.replace('"$argon2id$v=19$m=65536,t=3,p=4$…"',
                        '"' + PasswordHasher().hash("secret") + '"')
    for name in ("broker.crt", "broker.key", "clients-ca.crt"):
        (tmp_path / name).write_text("placeholder")
        text = text.replace(f"/etc/sluice/{name}", str(tmp_path / name))
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return BrokerConfig.load(path)


@pytest.mark.parametrize("index", range(len(toml_blocks())))
def test_every_readme_toml_block_loads(index: int, tmp_path: Path) -> None:
    load(toml_blocks()[index], tmp_path)


def test_the_configuration_block_shows_the_defaults(tmp_path: Path) -> None:
    cfg = load(block_starting("[broker]\n"), tmp_path)
    default = BrokerConfig()
    for name in ("host", "port", "console_port", "ws_port", "data_dir"):
        assert getattr(cfg, name) == getattr(default, name), name
    assert cfg.limits == Limits()
    assert cfg.journal == JournalSettings()
    assert cfg.ha == HaSettings()
    assert cfg.scheduler == SchedulerSettings()
    assert cfg.advisories == AdvisorySettings()
    assert cfg.virtual_topics == VirtualTopics()
    assert cfg.policy == Policy()


def test_the_configuration_block_lists_every_policy_and_journal_setting() -> None:
    text = block_starting("[broker]\n")
    section = {name: re.search(rf"^\[{name}\][^\n]*\n(.*?)(?:^\[|\Z)", text, re.S | re.M)
               for name in ("journal", "defaults")}
    for name, kind in (("journal", JournalSettings), ("defaults", Policy)):
        match = section[name]
        assert match is not None, name
        shown = set(re.findall(r"^(\w+) =", match.group(1), re.M))
        names = {f.name for f in fields(kind)}
        assert shown == names, (name, shown ^ names)


def test_the_resource_limits_and_ha_blocks_show_the_defaults(tmp_path: Path) -> None:
    assert load(block_starting("[limits]\nmax-connections"), tmp_path).limits == Limits()
    assert load(block_starting("[ha]\n"), tmp_path).ha == HaSettings()
