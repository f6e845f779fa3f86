"""Selector text to tokens: literals (string, decimal, octal, hex, floating), identifiers
(optionally hyphenated), keywords and operators, with the 1-based column of each."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluicemq.core.selectors.values import (
    SelectorError,
    Value,
    exact,
    parse_int,
)

# --------------------------------------------------------------------------- tokens

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE"}
)

_TOKEN_RE = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<string>'[^']*(?:''[^']*)*')  # unrolled so that it cannot backtrack
    | (?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
    | (?P<hex>0[xX][0-9a-fA-F]+)
    | (?P<int>[0-9]+[lL]?)
    | (?P<op><>|<=|>=|[=<>+\-*/(),])
    """,
    re.VERBOSE,
)
_IDENT_RE = re.compile(r"(?:[^\W\d]|\$)[\w$]*")
_HYPHENATED_IDENT_RE = re.compile(r"(?:[^\W\d]|\$)(?:[\w$]|-(?=[\w$]))*")
_IDENT_PART_RE = re.compile(r"[\w$]")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "string", "number", "ident", "keyword", "op", "end"
    value: Value
    text: str
    column: int

    def describe(self) -> str:
        return "end of selector" if self.kind == "end" else repr(self.text)


def tokenize(text: str, offset: int, hyphenated: bool) -> list[Token]:
    """Split ``text`` into tokens; ``offset`` is the length of any stripped prefix."""
    ident_re = _HYPHENATED_IDENT_RE if hyphenated else _IDENT_RE
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        column = offset + pos + 1
        ident = ident_re.match(text, pos)
        if ident:
            word = ident.group()
            if word.upper() in _KEYWORDS:
                tokens.append(Token("keyword", word.upper(), word, column))
            else:
                tokens.append(Token("ident", word, word, column))
            pos = ident.end()
            continue
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            if text[pos] == "'":
                raise SelectorError("unterminated string literal", column)
            if text[pos] == "!" and text.startswith("!=", pos):
                raise SelectorError("unknown operator '!=' (use '<>')", column)
            raise SelectorError(f"unexpected character {text[pos]!r}", column)
        kind, lexeme = match.lastgroup, match.group()
        pos = match.end()
        if kind == "space":
            continue
        if kind == "string":
            tokens.append(Token("string", lexeme[1:-1].replace("''", "'"), lexeme, column))
        elif kind == "op":
            tokens.append(Token("op", lexeme, lexeme, column))
        else:
            if pos < len(text) and _IDENT_PART_RE.match(text, pos):
                raise SelectorError(f"malformed number {lexeme + text[pos]!r}", column)
            tokens.append(Token("number", _number_literal(kind, lexeme, column), lexeme, column))
    tokens.append(Token("end", None, "", offset + len(text) + 1))
    return tokens


def _number_literal(kind: str | None, lexeme: str, column: int) -> int | float:
    """Value of a Java-style numeric literal: decimal, octal (leading 0), hex, or floating."""
    if kind == "float":
        return float(lexeme)
    if kind == "hex":
        return exact(int(lexeme[2:], 16))
    digits = lexeme.rstrip("lL")
    if len(digits) > 1 and digits.startswith("0"):
        if not all(c in "01234567" for c in digits):
            raise SelectorError(f"invalid octal literal {lexeme!r}", column)
        return exact(int(digits, 8))
    return parse_int(digits)
