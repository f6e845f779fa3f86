"""JMS message selectors (the SQL-92 subset of JMS 2.0 §3.8) evaluated over STOMP headers.

A pure leaf: imports nothing of SluiceMQ but ``errors``. ``lexer`` cuts the text into tokens,
``parser`` builds the tree of closures that ``evaluator`` defines, over the value rules of
``values``; callers use ``compile_selector`` and ``Selector.matches`` only.

A subscription's ``selector`` header is compiled once into a tree of closures and then run
against every candidate message, so evaluation must be cheap and must never raise: a bad
header value from one producer may not break delivery to anyone else.

Semantics, and where they follow ActiveMQ Classic rather than the letter of JMS:

* Identifiers name headers (case-sensitive). A missing header is NULL. JMS header names map
  to STOMP headers: JMSMessageID, JMSCorrelationID, JMSType, JMSDestination, JMSReplyTo to
  message-id, correlation-id, type, destination, reply-to; JMSPriority to priority (integer,
  default 4); JMSTimestamp to timestamp (integer); JMSExpiration to expires (integer,
  default 0); JMSDeliveryMode to 'PERSISTENT'/'NON_PERSISTENT' from persistent;
  JMSRedelivered to redelivered (boolean). JMSX* names are plain headers.
* The prefix ``hyphenated_props:`` lets identifiers contain ``-``, as in Artemis
  (``hyphenated_props:content-type = 'x'``); without it ``a-b`` means ``a - b``.
  ``convert_string_expressions:`` (which ActiveMQ's STOMP layer always adds) is accepted and
  ignored because conversion is always on.
* Three-valued logic: comparisons involving NULL are UNKNOWN, AND/OR/NOT follow the SQL
  truth tables, and a message matches only when the whole selector is TRUE.
* STOMP header values are strings. Compared with a number, or used in arithmetic, a string
  that spells a number is that number (ActiveMQ's ``convert_string_expressions``); compared
  with TRUE/FALSE, ``'true'``/``'false'`` (any case) are booleans.
* Values of unlike types compare FALSE (JMS §3.8.1.2 and ActiveMQ), not UNKNOWN, so
  ``NOT (x = 5)`` matches when ``x`` is ``'abc'``. Arithmetic on a non-number, or division
  by zero, yields NULL.
* Strings and booleans may be ordered with ``<``, ``<=``, ``>``, ``>=`` (ActiveMQ allows it;
  JMS does not): strings compare by code point, FALSE < TRUE.
* Exact numerics are 64-bit; an integer result outside that range becomes approximate
  (float) instead of wrapping. Integer division truncates toward zero, as in Java.
* LIKE is matched without backtracking regular expressions, so no pattern can make a
  match take more than O(len(value) * len(pattern)).
"""

from sluicemq.core.selectors.parser import Selector, compile_selector
from sluicemq.core.selectors.values import MAX_NESTING, MAX_SELECTOR_LENGTH, SelectorError

__all__ = [
    "MAX_NESTING",
    "MAX_SELECTOR_LENGTH",
    "Selector",
    "SelectorError",
    "compile_selector",
]
