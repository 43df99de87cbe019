"""A tiny, safe expression language for the relations a kernel variant declares.

A variant may constrain its tunables and the block shape in a comment, for example
``// r3: require TILE * VEC <= 64`` or ``// r3: require BLOCK_X % TILE == 0``.  The text comes
from a language model or a user, so it is never handed to ``eval``: this module tokenizes it and
parses it by recursive descent into a small tree of integer operations.

Grammar (C precedence, ``and``/``or``/``not`` or ``&&``/``||``/``!``)::

    expr    := or
    or      := and (("or" | "||") and)*
    and     := not (("and" | "&&") not)*
    not     := ("not" | "!") not | compare
    compare := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)*     # chained like Python
    sum     := term (("+" | "-") term)*
    term    := unary (("*" | "/" | "%") unary)*
    unary   := "-" unary | atom
    atom    := INTEGER | NAME | "(" expr ")"

Values are integers; comparisons and logic give 0 or 1.  ``/`` and ``%`` truncate toward zero
as in C; dividing by zero makes the relation false (the point is invalid), never an error.
Anything else (attribute access, calls, strings, ``**``) is a :class:`ExpressionError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from r3tui.errors import ConfigError

MAX_LENGTH = 400  # characters of one expression
MAX_DEPTH = 40  # nesting of parentheses / unary operators
MAX_DIGITS = 12  # digits of one integer literal

_TOKEN = re.compile(
    r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|==|!=|&&|\|\||[-+*/%<>!()]))"
)
_KEYWORDS = {"and": "&&", "or": "||", "not": "!"}
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")


class ExpressionError(ConfigError):
    """A relation that does not parse, or names something the search space does not know."""


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


_ARITH: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _c_div,
    "%": _c_mod,
}
_CMP: dict[str, Callable[[int, int], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


@dataclass(frozen=True)
class Num:
    value: int

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.value


@dataclass(frozen=True)
class Name:
    name: str

    def evaluate(self, env: Mapping[str, int]) -> int:
        return env[self.name]


@dataclass(frozen=True)
class Negate:
    operand: Node

    def evaluate(self, env: Mapping[str, int]) -> int:
        return -self.operand.evaluate(env)


@dataclass(frozen=True)
class Not:
    operand: Node

    def evaluate(self, env: Mapping[str, int]) -> int:
        return int(not self.operand.evaluate(env))


@dataclass(frozen=True)
class Arith:
    op: str
    left: Node
    right: Node

    def evaluate(self, env: Mapping[str, int]) -> int:
        return _ARITH[self.op](self.left.evaluate(env), self.right.evaluate(env))


@dataclass(frozen=True)
class Compare:
    operands: tuple[Node, ...]
    ops: tuple[str, ...]

    def evaluate(self, env: Mapping[str, int]) -> int:
        left = self.operands[0].evaluate(env)
        for op, node in zip(self.ops, self.operands[1:], strict=True):
            right = node.evaluate(env)
            if not _CMP[op](left, right):
                return 0
            left = right
        return 1


@dataclass(frozen=True)
class Logic:
    op: str  # "&&" or "||"
    operands: tuple[Node, ...]

    def evaluate(self, env: Mapping[str, int]) -> int:
        if self.op == "&&":
            return int(all(node.evaluate(env) for node in self.operands))
        return int(any(node.evaluate(env) for node in self.operands))


Node = Num | Name | Negate | Not | Arith | Compare | Logic


def _names(node: Node) -> set[str]:
    if isinstance(node, Name):
        return {node.name}
    if isinstance(node, Num):
        return set()
    if isinstance(node, Negate | Not):
        return _names(node.operand)
    if isinstance(node, Arith):
        return _names(node.left) | _names(node.right)
    found: set[str] = set()
    for child in node.operands:
        found |= _names(child)
    return found


@dataclass(frozen=True)
class Relation:
    """A parsed ``// r3: require ...`` line: :meth:`holds` on the tunables and block (also the
    size expression of a ``// r3: shared ...`` line: :meth:`value`)."""

    text: str
    tree: Node
    names: frozenset[str]

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether the relation is true; a division by zero makes it false."""
        try:
            return bool(self.tree.evaluate(env))
        except ZeroDivisionError:
            return False

    def value(self, env: Mapping[str, int]) -> int | None:
        """The expression's integer value (a ``// r3: shared`` size); None on a division by
        zero."""
        try:
            return self.tree.evaluate(env)
        except ZeroDivisionError:
            return None

    @classmethod
    def parse(cls, text: str) -> Relation:
        tree = _Parser(text).parse()
        return cls(text=" ".join(text.split()), tree=tree, names=frozenset(_names(tree)))


def _tokenize(text: str) -> list[str]:
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"relation is longer than {MAX_LENGTH} characters")
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            bad = text[pos:].lstrip()[:1]
            raise ExpressionError(
                f"relation {text.strip()!r}: unexpected character {bad!r}",
                hint="relations use names, integers, + - * / %, comparisons, and/or/not",
            )
        pos = match.end()
        if match.group("int") is not None:
            if len(match.group("int")) > MAX_DIGITS:
                raise ExpressionError(f"relation {text.strip()!r}: integer literal too long")
            tokens.append(match.group("int"))
        elif match.group("name") is not None:
            name = match.group("name")
            tokens.append(_KEYWORDS.get(name, name))
        else:
            tokens.append(match.group("op"))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text.strip()
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise ExpressionError("empty relation")
        node = self._or()
        if self.pos != len(self.tokens):
            self._fail(f"unexpected {self.tokens[self.pos]!r}")
        return node

    def _fail(self, why: str) -> None:
        raise ExpressionError(f"relation {self.text!r}: {why}")

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            self._fail("ends too early")
            raise AssertionError  # unreachable: _fail raises
        self.pos += 1
        return token

    def _nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._fail("nested too deeply")

    def _or(self) -> Node:
        return self._logic("||", self._and)

    def _and(self) -> Node:
        return self._logic("&&", self._not)

    def _logic(self, op: str, inner: Callable[[], Node]) -> Node:
        operands = [inner()]
        while self._peek() == op:
            self.pos += 1
            operands.append(inner())
        return operands[0] if len(operands) == 1 else Logic(op, tuple(operands))

    def _not(self) -> Node:
        if self._peek() == "!":
            self.pos += 1
            self._nest()
            node = Not(self._not())
            self.depth -= 1
            return node
        return self._compare()

    def _compare(self) -> Node:
        operands = [self._sum()]
        ops: list[str] = []
        while self._peek() in _COMPARE:
            ops.append(self._take())
            operands.append(self._sum())
        return operands[0] if not ops else Compare(tuple(operands), tuple(ops))

    def _sum(self) -> Node:
        node = self._term()
        while self._peek() in ("+", "-"):
            op = self._take()
            node = Arith(op, node, self._term())
        return node

    def _term(self) -> Node:
        node = self._unary()
        while self._peek() in ("*", "/", "%"):
            op = self._take()
            if self._peek() == "*":
                self._fail("'**' is not allowed")
            node = Arith(op, node, self._unary())
        return node

    def _unary(self) -> Node:
        if self._peek() == "-":
            self.pos += 1
            self._nest()
            node: Node = Negate(self._unary())
            self.depth -= 1
            return node
        return self._atom()

    def _atom(self) -> Node:
        token = self._take()
        if token == "(":
            self._nest()
            node = self._or()
            if self._take() != ")":
                self._fail("missing ')'")
            self.depth -= 1
            return node
        if token.isdigit():
            return Num(int(token))
        if token[0].isalpha() or token[0] == "_":
            if self._peek() == "(":
                self._fail(f"calls are not allowed ({token}(...))")
            if token.startswith("__"):
                self._fail(f"name {token!r} is not allowed")
            return Name(token)
        self._fail(f"unexpected {token!r}")
        raise AssertionError  # unreachable
