"""Spec of sluicemq.protocol.headers: STOMP header escaping per protocol version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicemq.errors import ProtocolError
from sluicemq.protocol.headers import UNESCAPED_COMMANDS, escape, unescape


class TestEscape:
    def test_stomp_1_0_has_no_escaping(self) -> None:
        assert escape("a:b\\c\nd\re", "1.0") == "a:b\\c\nd\re"

    def test_stomp_1_1_escapes_backslash_newline_and_colon_but_not_cr(self) -> None:
        assert escape("a:b\\c\nd\re", "1.1") == "a\\cb\\\\c\\nd\re"

    def test_stomp_1_2_also_escapes_carriage_return(self) -> None:
        assert escape("a:b\\c\nd\re", "1.2") == "a\\cb\\\\c\\nd\\re"

    def test_backslash_is_escaped_first_so_escapes_are_not_doubled(self) -> None:
        assert escape("\\n", "1.2") == "\\\\n"
        assert escape(":", "1.2") == "\\c"

    def test_plain_values_come_back_unchanged(self) -> None:
        value = "/queue/orders.eu-west"
        assert escape(value, "1.2") is value


class TestUnescape:
    @pytest.mark.parametrize("version", ["1.1", "1.2"])
    def test_defined_sequences(self, version: str) -> None:
        assert unescape("a\\cb\\\\c\\nd", version) == "a:b\\c\nd"

    def test_carriage_return_sequence_exists_only_in_1_2(self) -> None:
        assert unescape("x\\ry", "1.2") == "x\ry"
        with pytest.raises(ProtocolError, match=r"undefined escape"):
            unescape("x\\ry", "1.1")

    @pytest.mark.parametrize("version", ["1.1", "1.2"])
    @pytest.mark.parametrize("value", ["\\t", "a\\b", "\\x41", "\\ ", "\\C", "\\N"])
    def test_undefined_sequences_are_fatal(self, version: str, value: str) -> None:
        with pytest.raises(ProtocolError, match=r"undefined escape") as info:
            unescape(value, version)
        assert info.value.fatal

    @pytest.mark.parametrize("version", ["1.1", "1.2"])
    def test_trailing_lone_backslash_is_fatal(self, version: str) -> None:
        with pytest.raises(ProtocolError, match=r"trailing backslash"):
            unescape("abc\\", version)
        with pytest.raises(ProtocolError, match=r"trailing backslash"):
            unescape("abc\\\\\\", version)

    def test_escaped_backslash_binds_before_the_next_letter(self) -> None:
        # "\\\\n" is an escaped backslash followed by a plain "n", not a newline.
        assert unescape("\\\\n", "1.2") == "\\n"
        assert unescape("\\\\\\n", "1.2") == "\\\n"

    def test_stomp_1_0_takes_backslashes_literally(self) -> None:
        assert unescape("C:\\temp\\x", "1.0") == "C:\\temp\\x"


def test_handshake_commands_are_never_escaped() -> None:
    assert {"CONNECT", "STOMP", "CONNECTED"} == UNESCAPED_COMMANDS


@pytest.mark.parametrize("version", ["1.1", "1.2"])
@given(value=st.text())
def test_unescape_inverts_escape(version: str, value: str) -> None:
    wire = escape(value, version)
    assert "\n" not in wire
    assert ":" not in wire
    if version == "1.2":
        assert "\r" not in wire
    assert unescape(wire, version) == value
