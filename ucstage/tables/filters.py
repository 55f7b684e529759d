"""Row filters: what ``TableDataset(filter=...)``, ``shard-plan --filter`` and
``cache warm --filter`` take, checked against a table's schema.

A filter is a ``pyarrow.compute.Expression`` or a small SQL-like string,
parsed here by a hand-written recursive-descent parser (never ``eval``)::

    filter     := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | predicate
    predicate  := "(" or ")" | operand [compare | in | is]
    compare    := ("=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">=") operand
    in         := ["not"] "in" "(" literal ("," literal)* ")"
    is         := "is" ["not"] "null"
    operand    := column | literal
    column     := name | "quoted name" | `quoted name`
    literal    := 'text' | number | true | false

Keywords are case-insensitive; a quote inside a quoted text is doubled. A
literal takes the type of the column it is compared with (``'2024-01-31'``
against a date column is that date, ``3`` against an int8 column an int8),
so statistics prune it without casts and a value the column cannot hold is
refused at its position. A bare column is a predicate when it is boolean.

A string is parsed when the filter is made (a bad one fails at once, with
the character it fails at) and bound to the table's schema when its row
groups are listed (:meth:`RowFilter.bind`); an expression is checked then.
Either way a column the table lacks is :class:`~ucstage.errors.UnknownColumn`,
by name. The bound expression is what every reader applies and what the
statistics prune by (:mod:`ucstage.tables.prune`).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument, UnknownColumn
from ..manifest.arrays import one
from ..shown import shown

__all__ = ["BoundFilter", "RowFilter", "bound_from_header", "row_filter"]

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<text>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
  | (?P<op><=|>=|<>|!=|==|=|<|>|\(|\)|,)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)

_KEYWORDS = {"and", "or", "not", "in", "is", "null", "true", "false"}
_COMPARE = {"=": "equal", "==": "equal", "!=": "not_equal", "<>": "not_equal",
            "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}
_FLIPPED = {"less": "greater", "less_equal": "greater_equal", "greater": "less",
            "greater_equal": "less_equal", "equal": "equal", "not_equal": "not_equal"}


@dataclass(frozen=True)
class _Token:
    kind: str  # number, text, name, op, keyword, end
    value: str
    at: int  # 0-based character position in the filter


# The parsed tree: tuples, bound to the schema later (types decide the literals).
#   ("col", name, at) ("lit", value, at) ("cmp", op, left, right, at) ("and", a, b)
#   ("or", a, b) ("not", a) ("in", column, [literal...], negated, at)
#   ("null", column, negated) ("bool", column)
Node = tuple[Any, ...]


def _tokens(text: str) -> list[_Token]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise _error(text, at, f"unexpected character {shown(text[at])!r}")
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "name" and value.lower() in _KEYWORDS:
            out.append(_Token("keyword", value.lower(), at))
        elif kind == "quoted":
            out.append(_Token("name", value[1:-1].replace(value[0] * 2, value[0]), at))
        elif kind == "text":
            out.append(_Token("text", value[1:-1].replace("''", "'"), at))
        elif kind != "space":
            out.append(_Token(kind, value, at))
        at = m.end()
    out.append(_Token("end", "", len(text)))
    return out


def _error(text: str, at: int, what: str) -> InvalidArgument:
    return InvalidArgument(f"filter {shown(text)!r}: {what} at character {at + 1}",
                           hint="e.g. \"label >= 3 and split = 'train'\": comparisons, and/or/"
                                "not, in (...), is [not] null; text in single quotes")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        # An unterminated quote matches no token: say so rather than "unexpected '".
        for quote in ("'", '"', "`"):
            if self._unclosed(quote):
                raise _error(text, self._unclosed(quote) - 1, f"unclosed {quote}")
        self.tokens = _tokens(text)
        self.i = 0

    def _unclosed(self, quote: str) -> int:
        """1 + the position of a quote left open (0: none), scanning tokens' way."""
        at, open_at, inside = 0, 0, None
        for at, c in enumerate(self.text):
            if inside is None and c in "'\"`":
                inside, open_at = c, at
            elif inside == c:
                inside = None  # a doubled quote reopens at once: still balanced
        return open_at + 1 if inside == quote else 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def keyword(self, word: str) -> bool:
        if self.peek.kind == "keyword" and self.peek.value == word:
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: str, what: str) -> _Token:
        token = self.peek
        if token.kind != kind or token.value != value:
            raise self.unexpected(what)
        return self.take()

    def unexpected(self, what: str) -> InvalidArgument:
        token = self.peek
        found = "the end" if token.kind == "end" else repr(shown(self.text[token.at:].split()[0]
                                                                 if token.kind != "text" else
                                                                 "'" + token.value + "'"))
        return _error(self.text, token.at, f"expected {what}, found {found}")

    def parse(self) -> Node:
        if self.peek.kind == "end":
            raise _error(self.text, 0, "empty filter")
        node = self.or_()
        if self.peek.kind != "end":
            raise self.unexpected("and, or or the end")
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.keyword("or"):
            node = ("or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.keyword("and"):
            node = ("and", node, self.not_())
        return node

    def not_(self) -> Node:
        if self.keyword("not"):
            return ("not", self.not_())
        return self.predicate()

    def operand(self) -> Node:
        token = self.peek
        if token.kind == "name":
            self.take()
            return ("col", token.value, token.at)
        if token.kind in ("number", "text") or (token.kind == "keyword" and
                                                 token.value in ("true", "false")):
            self.take()
            return ("lit", self._value(token), token.at)
        raise self.unexpected("a column or a value")

    @staticmethod
    def _value(token: _Token) -> Any:
        if token.kind == "keyword":
            return token.value == "true"
        if token.kind == "number":
            return float(token.value) if any(c in token.value for c in ".eE") \
                else int(token.value)
        return token.value

    def predicate(self) -> Node:
        if self.peek.kind == "op" and self.peek.value == "(":
            self.take()
            node = self.or_()
            self.expect("op", ")", "')'")
            return node
        start = self.peek.at
        left = self.operand()
        token = self.peek
        if token.kind == "op" and token.value in _COMPARE:
            self.take()
            right = self.operand()
            if left[0] == "lit" and right[0] == "lit":
                raise _error(self.text, start, "a comparison needs a column")
            return ("cmp", _COMPARE[token.value], left, right, token.at)
        negated = False
        if token.kind == "keyword" and token.value == "not":
            self.take()
            negated = True
            if not (self.peek.kind == "keyword" and self.peek.value == "in"):
                raise self.unexpected("in after not")
        if self.keyword("in"):
            column = self._column(left, start, "in")
            self.expect("op", "(", "'(' after in")
            values = [self._literal()]
            while self.peek.kind == "op" and self.peek.value == ",":
                self.take()
                values.append(self._literal())
            self.expect("op", ")", "',' or ')'")
            return ("in", column, values, negated, start)
        if self.keyword("is"):
            column = self._column(left, start, "is null")
            negated = self.keyword("not")
            if not self.keyword("null"):
                raise self.unexpected("null")
            return ("null", column, negated)
        if left[0] == "col":
            return ("bool", left)
        raise self.unexpected("a comparison after the value")

    def _column(self, node: Node, at: int, what: str) -> Node:
        if node[0] != "col":
            raise _error(self.text, at, f"{what} needs a column on its left")
        return node

    def _literal(self) -> Node:
        node = self.operand()
        if node[0] != "lit":
            raise _error(self.text, node[2], "in (...) takes values, not columns")
        return node


@dataclass(frozen=True)
class BoundFilter:
    """A filter bound to a table's schema: what a frozen listing records."""

    text: str
    """How it reads (the string as given, or the expression's own text)."""
    expression: Any
    """The ``pyarrow.compute.Expression`` every reader applies."""
    columns: tuple[str, ...]
    """The table's columns it reads, in schema order."""

    def header(self) -> dict[str, Any]:
        """Its form in a row-group manifest's header (docs/manifest.md)."""
        serialized = self.expression.__reduce__()[1][0]  # Arrow's own (IPC) form
        return {"text": self.text, "columns": list(self.columns),
                "expression": base64.b64encode(serialized.to_pybytes()).decode()}


def bound_from_header(value: dict[str, Any]) -> BoundFilter:
    """A :class:`BoundFilter` from its header form."""
    import pyarrow as pa
    import pyarrow.compute as pc

    data = pa.py_buffer(base64.b64decode(value["expression"]))
    return BoundFilter(str(value["text"]), pc.Expression._deserialize(data),
                       tuple(value["columns"]))


class RowFilter:
    """A filter as given: an expression, or a string parsed at once."""

    def __init__(self, given: Any) -> None:
        import pyarrow.compute as pc

        if isinstance(given, pc.Expression):
            self.text, self._tree, self._expression = str(given), None, given
        elif isinstance(given, str):
            self.text = given.strip()
            self._tree = _Parser(self.text).parse()
            self._expression = None
        else:
            raise InvalidArgument(f"filter must be a pyarrow.compute.Expression or a string, "
                                  f"got {type(given).__name__}")

    def __repr__(self) -> str:
        return f"RowFilter({self.text!r})"

    def bind(self, schema: Any, label: str) -> BoundFilter:
        """The filter bound to ``schema`` (of table ``label``).

        Raises:
            UnknownColumn: a column the table lacks, by name.
            InvalidArgument: a value its column cannot hold, a comparison
                the types do not allow, a filter that is not true/false.
        """
        if self._tree is not None:
            binder = _Binder(self.text, schema, label)
            expression = binder.expr(self._tree)
            columns = [c for c in schema.names if c in binder.used]
        else:
            expression = self._expression
            columns = _expression_columns(expression, schema, label)
        _check_boolean(expression, schema, columns, self.text)
        return BoundFilter(self.text, expression, tuple(columns))


def row_filter(given: Any) -> RowFilter | None:
    """``given`` (None, an expression, a string or a :class:`RowFilter`) as a RowFilter."""
    if given is None or isinstance(given, RowFilter):
        return given
    return RowFilter(given)


class _Binder:
    """The parsed tree as an expression of ``schema``'s columns."""

    def __init__(self, text: str, schema: Any, label: str) -> None:
        self.text, self.schema, self.label = text, schema, label
        self.used: set[str] = set()

    def column(self, node: Node) -> Any:
        import pyarrow.compute as pc

        name = node[1]
        if name not in self.schema.names:
            raise UnknownColumn(f"filter {shown(self.text)!r} names column {shown(name)!r}, "
                                f"which {shown(self.label)} lacks",
                                hint=f"its columns: {shown(', '.join(self.schema.names))}")
        self.used.add(name)
        return pc.field(name)

    def literal(self, node: Node, column: str | None) -> Any:
        """A literal in its column's type (when it is compared with one)."""
        return self.literal_array(node, column)[0]

    def literal_array(self, node: Node, column: str | None) -> Any:
        """:meth:`literal` as an array of one (built from buffers: ``pa.scalar``
        and ``pa.array`` import pandas, a second of every freeze)."""
        import pyarrow as pa

        value, at = node[1], node[2]
        if column is None:
            return one(value)
        kind = self.schema.field(column).type
        numeric = (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                   or pa.types.is_decimal(kind))
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # Text may name any type's value ('2024-01-31', '1.5'); a number only
        # a number, true/false only a boolean (3 is no string's value).
        fits = isinstance(value, str) or (number and numeric) or \
            (isinstance(value, bool) and pa.types.is_boolean(kind))
        if fits:
            try:
                return one(value).cast(kind)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        if number and numeric:
            return one(value)  # 2.5 against an int column: compared as numbers
        shown_value = f"'{value}'" if isinstance(value, str) else str(value).lower()
        raise _error(self.text, at, f"{shown(shown_value)} is not a value of column "
                                    f"{shown(column)!r} ({kind})")

    def expr(self, node: Node) -> Any:
        import pyarrow.compute as pc

        kind = node[0]
        if kind == "and":
            return self.expr(node[1]) & self.expr(node[2])
        if kind == "or":
            return self.expr(node[1]) | self.expr(node[2])
        if kind == "not":
            inner = node[1]
            if inner[0] == "in":  # not x in (...) is x not in (...)
                return self.expr(("in", inner[1], inner[2], not inner[3], inner[4]))
            return ~self.expr(inner)
        if kind == "null":
            test = self.column(node[1]).is_null()
            return ~test if node[2] else test
        if kind == "bool":
            return self.column(node[1])
        if kind == "in":
            field = self.column(node[1])
            import pyarrow as pa

            values = [self.literal_array(v, node[1][1]) for v in node[2]]
            kinds = {v.type for v in values}
            array = pa.concat_arrays(values) if len(kinds) == 1 else \
                pa.array([v[0].as_py() for v in values])  # mixed numbers: a common type
            # As in SQL a null is in no list and not out of one: neither
            # "x in (...)" nor "x not in (...)" (nor "not x in (...)") holds for it.
            test = pc.is_in(field, value_set=array, skip_nulls=True)
            return ~test & field.is_valid() if node[3] else test
        # a comparison: column op value, value op column, or column op column
        op, left, right = node[1], node[2], node[3]
        if left[0] == "lit":
            op, left, right = _FLIPPED[op], right, left
        a = self.column(left)
        b = self.column(right) if right[0] == "col" else self.literal(right, left[1])
        return getattr(pc, op)(a, b)


def _check_boolean(expression: Any, schema: Any, columns: list[str], text: str) -> None:
    """Refuse a filter that does not bind as true/false over the table's rows."""
    import pyarrow as pa

    empty = pa.schema([schema.field(c) for c in columns]).empty_table()
    try:
        empty.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidArgument(f"filter {shown(text)!r} cannot be applied to the table's "
                              f"rows ({shown(first[:200])})",
                              hint="compare each column with a value of its type; the "
                                   "filter must be true or false for each row") from None


_NO_MATCH = re.compile(r"No match for FieldRef\.(?:Name|Nested)\((.*?)\) in ")


def _expression_columns(expression: Any, schema: Any, label: str) -> list[str]:
    """The top-level columns of ``schema`` an expression reads: those its text
    names, fewest that still bind (a name inside another name's text is tried
    without); a column the table lacks is refused by name."""
    import pyarrow as pa

    def binds(names: list[str]) -> str | None:
        try:
            pa.schema([schema.field(c) for c in names]).empty_table().filter(expression)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            return str(exc)
        return None

    text = str(expression)
    error = binds(list(schema.names))
    if error is not None:
        missing = _NO_MATCH.search(error)
        if missing is not None:
            name = missing.group(1).split(" ")[0]
            raise UnknownColumn(f"filter {shown(text)!r} names column {shown(name)!r}, which "
                                f"{shown(label)} lacks",
                                hint=f"its columns: {shown(', '.join(schema.names))}")
        return list(schema.names)  # _check_boolean says what is wrong
    named = [c for c in schema.names if c in text]
    if binds(named) is not None:
        return list(schema.names)
    for c in list(named):
        fewer = [n for n in named if n != c]
        if binds(fewer) is None:
            named = fewer
    return named
