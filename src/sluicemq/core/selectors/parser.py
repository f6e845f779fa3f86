"""Tokens to a compiled ``Selector``: recursive descent over the JMS grammar, with type
checks where the parser can tell (a number is no condition) and bounded nesting."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NoReturn

from sluicemq.core.selectors.evaluator import (
    JMS_HEADERS,
    Kind,
    Node,
    and_,
    arithmetic,
    between,
    comparison,
    constant,
    header_of,
    in_,
    is_null,
    like,
    like_matcher,
    negate,
    not_,
    or_,
    truth,
    typed_header,
)
from sluicemq.core.selectors.lexer import (
    Token,
    tokenize,
)
from sluicemq.core.selectors.values import (
    COMPARISONS,
    CONVERT_PREFIX,
    HYPHENATED_PREFIX,
    MAX_NESTING,
    MAX_SELECTOR_LENGTH,
    MAX_TREE_DEPTH,
    Evaluator,
    Headers,
    SelectorError,
)

# --------------------------------------------------------------------------- parser

class _Parser:
    """Recursive descent over the JMS grammar, building closures as it goes.

    Precedence, loosest first: OR, AND, NOT, comparison/BETWEEN/IN/LIKE/IS, + -, * /, sign.
    """

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens
        self._pos = 0
        self._nesting = 0

    # -- helpers

    def _peek(self) -> Token:
        return self._tokens[self._pos]

    def _advance(self) -> Token:
        token = self._tokens[self._pos]
        if token.kind != "end":
            self._pos += 1
        return token

    def _at(self, kind: str, *values: str) -> bool:
        token = self._tokens[self._pos]
        return token.kind == kind and (not values or token.value in values)

    def _expect(self, kind: str, value: str, what: str) -> Token:
        if not self._at(kind, value):
            self._fail(f"expected {what}")
        return self._advance()

    def _fail(self, expectation: str) -> NoReturn:
        token = self._peek()
        raise SelectorError(f"{expectation}, found {token.describe()}", token.column)

    def _enter(self, token: Token) -> None:
        self._nesting += 1
        if self._nesting > MAX_NESTING:
            raise SelectorError(f"selector nests deeper than {MAX_NESTING} levels", token.column)

    def _node(self, evaluate: Evaluator, kind: Kind, column: int, *children: Node) -> Node:
        depth = 1 + max((child.depth for child in children), default=0)
        if depth > MAX_TREE_DEPTH:
            raise SelectorError("selector is too deeply nested", column)
        return Node(evaluate, kind, depth, column)

    @staticmethod
    def _condition(node: Node, role: str) -> Node:
        """Check that ``node`` can stand where a TRUE/FALSE/UNKNOWN is needed."""
        if node.kind is Kind.BOOL:
            return node
        if node.kind is Kind.ANY:
            return Node(truth(node.evaluate), Kind.BOOL, node.depth + 1, node.column)
        raise SelectorError(f"{role} needs a condition, not a {node.kind.value} value", node.column)

    @staticmethod
    def _numeric(node: Node, role: str) -> Node:
        if node.kind in (Kind.NUM, Kind.ANY):
            return node
        raise SelectorError(f"{role} needs a number, not a {node.kind.value} value", node.column)

    # -- grammar

    def parse(self) -> Node:
        node = self._condition(self._or_expr(), "a selector")
        if not self._at("end"):
            self._fail("expected an operator or the end of the selector")
        return node

    def _or_expr(self) -> Node:
        return self._logical("OR", self._and_expr, or_)

    def _and_expr(self) -> Node:
        return self._logical("AND", self._not_expr, and_)

    def _logical(
        self,
        keyword: str,
        operand: Callable[[], Node],
        combine: Callable[[Sequence[Evaluator]], Evaluator],
    ) -> Node:
        first = operand()
        if not self._at("keyword", keyword):
            return first
        terms = [self._condition(first, keyword)]
        while self._at("keyword", keyword):
            self._advance()
            terms.append(self._condition(operand(), keyword))
        return self._node(combine([t.evaluate for t in terms]), Kind.BOOL, first.column, *terms)

    def _not_expr(self) -> Node:
        if not self._at("keyword", "NOT"):
            return self._comparison()
        token = self._advance()
        self._enter(token)
        inner = self._condition(self._not_expr(), "NOT")
        self._nesting -= 1
        return self._node(not_(inner.evaluate), Kind.BOOL, token.column, inner)

    def _comparison(self) -> Node:
        left = self._additive()
        token = self._peek()
        if token.kind == "op" and token.value in COMPARISONS:
            self._advance()
            right = self._additive()
            if self._peek().kind == "op" and self._peek().value in COMPARISONS:
                self._fail("comparisons cannot be chained (combine them with AND)")
            evaluate = comparison(str(token.value), left.evaluate, right.evaluate)
            return self._node(evaluate, Kind.BOOL, token.column, left, right)
        if token.kind != "keyword":
            return left
        negated = token.value == "NOT"
        if negated:
            self._advance()
            if not self._at("keyword", "BETWEEN", "IN", "LIKE"):
                self._fail("expected BETWEEN, IN or LIKE after NOT")
        if self._at("keyword", "BETWEEN"):
            return self._between(left, negated)
        if self._at("keyword", "IN"):
            return self._in(left, negated)
        if self._at("keyword", "LIKE"):
            return self._like(left, negated)
        if self._at("keyword", "IS"):
            return self._is_null(left)
        return left

    def _between(self, left: Node, negated: bool) -> Node:
        token = self._advance()
        low = self._additive()
        self._expect("keyword", "AND", "AND between the BETWEEN bounds")
        high = self._additive()
        evaluate = between(left.evaluate, low.evaluate, high.evaluate, negated)
        return self._node(evaluate, Kind.BOOL, token.column, left, low, high)

    def _in(self, left: Node, negated: bool) -> Node:
        token = self._advance()
        self._string_subject(left, "IN")
        self._expect("op", "(", "'(' after IN")
        choices = [self._string_literal("IN list items must be string literals")]
        while self._at("op", ","):
            self._advance()
            choices.append(self._string_literal("IN list items must be string literals"))
        self._expect("op", ")", "',' or ')' in the IN list")
        return self._node(in_(left.evaluate, choices, negated), Kind.BOOL, token.column, left)

    def _like(self, left: Node, negated: bool) -> Node:
        token = self._advance()
        self._string_subject(left, "LIKE")
        pattern_column = self._peek().column
        pattern = self._string_literal("LIKE needs a string literal pattern")
        escape = None
        if self._at("keyword", "ESCAPE"):
            self._advance()
            escape_token = self._peek()
            escape = self._string_literal("ESCAPE needs a string literal")
            if len(escape) != 1:
                raise SelectorError("ESCAPE must be a single character", escape_token.column)
        matcher = like_matcher(pattern, escape, pattern_column)
        return self._node(like(left.evaluate, matcher, negated), Kind.BOOL, token.column, left)

    def _is_null(self, left: Node) -> Node:
        token = self._advance()
        negated = self._at("keyword", "NOT")
        if negated:
            self._advance()
        wanted = "NULL after IS NOT" if negated else "NULL or NOT NULL after IS"
        self._expect("keyword", "NULL", wanted)
        return self._node(is_null(left.evaluate, negated), Kind.BOOL, token.column, left)

    def _string_subject(self, node: Node, operation: str) -> None:
        if node.kind not in (Kind.STR, Kind.ANY):
            raise SelectorError(
                f"{operation} needs a string, not a {node.kind.value} value", node.column
            )

    def _string_literal(self, message: str) -> str:
        if not self._at("string"):
            self._fail(message)
        return str(self._advance().value)

    def _additive(self) -> Node:
        return self._arithmetic(("+", "-"), self._multiplicative)

    def _multiplicative(self) -> Node:
        return self._arithmetic(("*", "/"), self._unary)

    def _arithmetic(self, ops: tuple[str, ...], operand: Callable[[], Node]) -> Node:
        first = operand()
        if not self._at("op", *ops):
            return first
        terms = [self._numeric(first, "arithmetic")]
        rest: list[tuple[str, Evaluator]] = []
        while self._at("op", *ops):
            op = str(self._advance().value)
            term = self._numeric(operand(), f"'{op}'")
            terms.append(term)
            rest.append((op, term.evaluate))
        evaluate = arithmetic(first.evaluate, rest)
        return self._node(evaluate, Kind.NUM, first.column, *terms)

    def _unary(self) -> Node:
        if not self._at("op", "+", "-"):
            return self._primary()
        token = self._advance()
        self._enter(token)
        inner = self._numeric(self._unary(), f"unary '{token.value}'")
        self._nesting -= 1
        evaluate = arithmetic(inner.evaluate, ()) if token.value == "+" else negate(inner.evaluate)
        return self._node(evaluate, Kind.NUM, token.column, inner)

    def _primary(self) -> Node:
        token = self._peek()
        if token.kind == "op" and token.value == "(":
            self._advance()
            self._enter(token)
            inner = self._or_expr()
            self._nesting -= 1
            self._expect("op", ")", "')'")
            return inner
        if token.kind == "number":
            self._advance()
            return Node(constant(token.value), Kind.NUM, 1, token.column)
        if token.kind == "string":
            self._advance()
            return Node(constant(token.value), Kind.STR, 1, token.column)
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
            self._advance()
            return Node(constant(token.value == "TRUE"), Kind.BOOL, 1, token.column)
        if token.kind == "ident":
            self._advance()
            name = str(token.value)
            if name in JMS_HEADERS:
                header, kind, convert = JMS_HEADERS[name]
                return Node(typed_header(header, convert), kind, 1, token.column)
            return Node(header_of(name), Kind.ANY, 1, token.column)
        if token.kind == "keyword" and token.value == "NULL":
            raise SelectorError("NULL can only be tested with IS [NOT] NULL", token.column)
        self._fail("expected a value")


# --------------------------------------------------------------------------- public API

class Selector:
    """A compiled selector; ``matches`` is safe to call on any headers from any producer."""

    __slots__ = ("_evaluate", "text")

    def __init__(self, text: str, evaluate: Evaluator) -> None:
        self.text = text
        self._evaluate = evaluate

    def matches(self, headers: Headers) -> bool:
        """True only if the selector evaluates to TRUE (FALSE and UNKNOWN both reject)."""
        return self._evaluate(headers) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse ``text`` into a Selector, raising SelectorError with a column on bad syntax.

    Cached because many subscriptions commonly share one selector string.
    """
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector is longer than {MAX_SELECTOR_LENGTH} characters")
    body, hyphenated = text, False
    while True:
        if body.startswith(CONVERT_PREFIX):
            body = body[len(CONVERT_PREFIX):]
        elif body.startswith(HYPHENATED_PREFIX):
            body, hyphenated = body[len(HYPHENATED_PREFIX):], True
        else:
            break
    if not body.strip():
        raise SelectorError("selector is empty")
    tokens = tokenize(body, len(text) - len(body), hyphenated)
    return Selector(text, _Parser(tokens).parse().evaluate)
