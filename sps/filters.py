"""Header filters of stage outputs: which output records go to which stream.

A stage output may name a `filter` on the output record's headers, like an SNS
subscription filter policy for an SNS -> SQS fan-out:

    outputs:
      - {stream: eu-clicks, key: user, filter: {region: [eu-west, eu-north]}}
      - {stream: big-orders, key: user, filter: {type: [order], amount: [{numeric: [">=", 100]}]}}
      - {stream: not-test, key: user, filter: {env: [{anything-but: [test, dev]}]}}
      - {stream: has-trace, key: user, filter: {trace: [{exists: true}], region: [{prefix: eu-}]}}

A filter maps header names to non-empty lists of conditions. A record matches when every
named header matches (AND across names), and a header matches when any of its conditions
does (OR within the list). Conditions on the header's value, compared as UTF-8 text:

    "eu-west"                            the text is exactly this
    100                                  the text is a number equal to 100 ("100", "100.0", "1e2")
    {prefix: "eu-"}  {suffix: ".gz"}     the text starts / ends with this
    {anything-but: [test, dev]}          the text is none of these (a string, a number or a list
    {anything-but: {prefix: "tmp-"}}       of them; or: the text does not start with this)
    {numeric: [">=", 100]}               the text is a number in this range (ops = < <= > >=);
    {numeric: [">", 0, "<=", 5]}           a range is a lower bound then an upper bound
    {exists: true}  {exists: false}      the header is present / absent

Every condition but `exists: false` needs the header present. A value that is not valid
UTF-8 matches `exists: true` only; a text that is not a plain decimal number (such as
"nan", "1_000" or " 5") matches no numeric condition. An absent or empty filter matches
every record.

`parse_filter` checks a YAML/JSON value strictly and compiles it once (exact texts to a
frozenset, prefixes to a tuple, ...), since `HeaderFilter.matches` runs once per output
record per filtered output. sps/graph.py parses the `filter` of each output and re-raises
a `FilterError` as its `InvalidGraph`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sms import limits

FILTER_HEADERS_MAX = limits.SPS_FILTER_HEADERS_MAX
FILTER_VALUES_MAX = limits.SPS_FILTER_VALUES_MAX

CONDITION_KEYS = ("prefix", "suffix", "anything-but", "exists", "numeric")
NUMERIC_OPS: dict[str, Callable[[float, float], bool]] = {
    "=": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_LOWER_OPS = (">", ">=")
_UPPER_OPS = ("<", "<=")
# A header value that counts as a number: plain decimal, optional sign, fraction and exponent.
# (Stricter than float(): no "nan", "inf", "1_000", surrounding blanks or non-ASCII digits.)
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)

# One condition as parsed, hashable and in its written form: a str or a number (exact), or
# (key, argument) for a mapping, e.g. ("numeric", (">=", 100)), ("anything-but", ("a", "b")),
# ("anything-but-prefix", "tmp-").
Condition = str | int | float | tuple[str, object]


class FilterError(ValueError):
    """A filter that cannot be used: the message names the header and what is wrong."""


def _number_of(text: str) -> float | None:
    """The number a header value's text spells, or None."""
    if _NUMBER_TEXT.fullmatch(text) is None:
        return None
    number = float(text)
    return number if math.isfinite(number) else None


@dataclass(frozen=True, slots=True)
class _AnythingBut:
    texts: frozenset[str] = frozenset()
    numbers: frozenset[float] = frozenset()
    prefix: str | None = None

    def matches(self, text: str, number: float | None) -> bool:
        if self.prefix is not None:
            return not text.startswith(self.prefix)
        return text not in self.texts and (number is None or number not in self.numbers)


@dataclass(frozen=True, slots=True)
class _HeaderRule:
    """The conditions on one header name, compiled. Equal when written alike."""
    name: str
    conditions: tuple[Condition, ...]
    absent: bool = field(default=False, compare=False)      # exists: false
    present: bool = field(default=False, compare=False)     # exists: true
    texts: frozenset[str] = field(default=frozenset(), compare=False)
    prefixes: tuple[str, ...] = field(default=(), compare=False)
    suffixes: tuple[str, ...] = field(default=(), compare=False)
    numbers: frozenset[float] = field(default=frozenset(), compare=False)
    ranges: tuple[tuple[tuple[Callable[[float, float], bool], float], ...], ...] = field(default=(), compare=False)
    anything_but: tuple[_AnythingBut, ...] = field(default=(), compare=False)
    numeric: bool = field(default=False, compare=False)     # some condition needs the value as a number

    def matches(self, value: bytes | None) -> bool:
        if value is None:
            return self.absent
        if self.present:
            return True
        try:
            text = str(value, "utf-8")
        except UnicodeDecodeError:
            return False
        if text in self.texts or text.startswith(self.prefixes) or text.endswith(self.suffixes):
            return True
        number = _number_of(text) if self.numeric else None
        if number is not None:
            if number in self.numbers:
                return True
            for bounds in self.ranges:
                if all(op(number, n) for op, n in bounds):
                    return True
        for ab in self.anything_but:
            if ab.matches(text, number):
                return True
        return False


@dataclass(frozen=True, slots=True, repr=False)
class HeaderFilter:
    """A parsed filter; `HeaderFilter()` (false) matches every record. Two filters are
    equal when written alike, up to the order of their header names."""
    rules: tuple[_HeaderRule, ...] = ()

    def matches(self, headers: Mapping[str, bytes] | None) -> bool:
        if not self.rules:
            return True
        if headers is None:
            headers = {}
        for rule in self.rules:
            if not rule.matches(headers.get(rule.name)):
                return False
        return True

    def to_doc(self) -> dict[str, list]:
        """The JSON-able form, as parse_filter takes it."""
        return {rule.name: [_condition_doc(c) for c in rule.conditions] for rule in self.rules}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __repr__(self) -> str:
        return f"HeaderFilter({self.to_doc()!r})"


def _condition_doc(c: Condition) -> object:
    if not isinstance(c, tuple):
        return c
    key, arg = c
    if key == "anything-but-prefix":
        return {"anything-but": {"prefix": arg}}
    if isinstance(arg, tuple):
        return {key: list(arg)}
    return {key: arg}


def parse_filter(doc: object) -> HeaderFilter:
    """The filter a YAML/JSON value spells (None or {}: everything); FilterError if it is
    not a mapping of header names to non-empty lists of known conditions."""
    if doc is None:
        return HeaderFilter()
    if not isinstance(doc, dict):
        raise FilterError(f"a filter maps header names to lists of conditions; got {doc!r}")
    if len(doc) > FILTER_HEADERS_MAX:
        raise FilterError(f"a filter names at most {FILTER_HEADERS_MAX} headers; got {len(doc)}")
    for name in doc:
        if not isinstance(name, str):
            raise FilterError(f"header name {name!r}: expected text (quote it in YAML)")
        if not 0 < len(name.encode()) <= limits.RECORD_HEADER_NAME_BYTES_MAX:
            raise FilterError(f"header {name!r}: a header name is 1..{limits.RECORD_HEADER_NAME_BYTES_MAX} "
                              "bytes of UTF-8")
    return HeaderFilter(tuple(_parse_rule(name, doc[name]) for name in sorted(doc)))


def _parse_rule(name: str, doc: object) -> _HeaderRule:
    where = f"header {name!r}"
    if not isinstance(doc, list) or not doc:
        raise FilterError(f"{where}: expected a non-empty list of conditions; got {doc!r}")
    if len(doc) > FILTER_VALUES_MAX:
        raise FilterError(f"{where}: at most {FILTER_VALUES_MAX} conditions; got {len(doc)}")
    conditions = tuple(_parse_condition(where, c) for c in doc)
    texts: set[str] = set()
    numbers: set[float] = set()
    prefixes: list[str] = []
    suffixes: list[str] = []
    ranges: list[tuple[tuple[Callable[[float, float], bool], float], ...]] = []
    anything_but: list[_AnythingBut] = []
    absent = present = False
    for c in conditions:
        if isinstance(c, str):
            texts.add(c)
        elif not isinstance(c, tuple):
            numbers.add(float(c))
        else:
            key, arg = c
            if key == "prefix":
                prefixes.append(arg)
            elif key == "suffix":
                suffixes.append(arg)
            elif key == "exists":
                present |= arg is True
                absent |= arg is False
            elif key == "numeric":
                ranges.append(tuple((NUMERIC_OPS[arg[i]], float(arg[i + 1])) for i in range(0, len(arg), 2)))
            elif key == "anything-but-prefix":
                anything_but.append(_AnythingBut(prefix=arg))
            else:
                assert key == "anything-but", key
                anything_but.append(_AnythingBut(frozenset(a for a in arg if isinstance(a, str)),
                                                 frozenset(float(a) for a in arg if not isinstance(a, str))))
    return _HeaderRule(
        name, conditions, absent=absent, present=present, texts=frozenset(texts), prefixes=tuple(prefixes),
        suffixes=tuple(suffixes), numbers=frozenset(numbers), ranges=tuple(ranges),
        anything_but=tuple(anything_but),
        numeric=bool(numbers or ranges or any(ab.numbers for ab in anything_but)))


def _is_number(x: object) -> bool:
    """A finite int or float, not a bool (YAML `yes`/`no` are bools)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _text(where: str, what: str, x: object) -> str:
    """x as a string condition: text no longer than any header value can be."""
    if not isinstance(x, str):
        raise FilterError(f"{where}: {what} needs a string; got {x!r}")
    if len(x.encode()) > limits.RECORD_HEADERS_BYTES_MAX:
        raise FilterError(f"{where}: {what} of {len(x.encode())} bytes; a header value has at most "
                          f"{limits.RECORD_HEADERS_BYTES_MAX}")
    return x


def _affix(where: str, key: str, x: object) -> str:
    s = _text(where, key, x)
    if not s:
        raise FilterError(f"{where}: {key} needs a non-empty string (for any value use {{exists: true}})")
    return s


def _parse_condition(where: str, c: object) -> Condition:
    if isinstance(c, str):
        return _text(where, "a value", c)
    if _is_number(c):
        return c
    if not isinstance(c, dict):
        raise FilterError(f"{where}: a condition is a string, a number or a {{key: argument}} mapping; got {c!r} "
                          "(quote yes/no/true/false in YAML)")
    if len(c) != 1:
        raise FilterError(f"{where}: a condition mapping has exactly one key; got {c!r}")
    ((key, arg),) = c.items()
    if key in ("prefix", "suffix"):
        return (key, _affix(where, key, arg))
    if key == "exists":
        if not isinstance(arg, bool):
            raise FilterError(f"{where}: exists needs true or false; got {arg!r}")
        return (key, arg)
    if key == "numeric":
        return (key, _numeric(where, arg))
    if key == "anything-but":
        return _anything_but(where, arg)
    raise FilterError(f"{where}: unknown condition {key!r}; expected one of {', '.join(CONDITION_KEYS)}")


def _numeric(where: str, arg: object) -> tuple:
    shape = "numeric needs [op, number] or [op, number, op, number]"
    if (not isinstance(arg, list) or len(arg) not in (2, 4)
            or not all(isinstance(op, str) and _is_number(n) for op, n in zip(arg[::2], arg[1::2]))):
        raise FilterError(f"{where}: {shape}; got {arg!r}")
    for op in arg[::2]:
        if op not in NUMERIC_OPS:
            raise FilterError(f"{where}: numeric operator {op!r}; expected one of {', '.join(NUMERIC_OPS)}")
    if len(arg) == 4:
        if arg[0] not in _LOWER_OPS or arg[2] not in _UPPER_OPS:
            raise FilterError(f"{where}: a numeric range is a lower bound ({' or '.join(_LOWER_OPS)}) then an "
                              f"upper bound ({' or '.join(_UPPER_OPS)}); got {arg!r}")
        if not arg[1] < arg[3]:
            raise FilterError(f"{where}: numeric range {arg!r}: the lower bound must be below the upper bound")
    return tuple(arg)


def _anything_but(where: str, arg: object) -> Condition:
    if isinstance(arg, dict):
        if set(arg) != {"prefix"}:
            raise FilterError(f"{where}: anything-but takes a string, a number, a list of them or {{prefix: STRING}}; "
                              f"got {arg!r}")
        return ("anything-but-prefix", _affix(where, "anything-but prefix", arg["prefix"]))
    items = arg if isinstance(arg, list) else [arg]
    if not items or len(items) > FILTER_VALUES_MAX:
        raise FilterError(f"{where}: anything-but needs 1..{FILTER_VALUES_MAX} strings or numbers; got {arg!r}")
    for x in items:
        if not (_is_number(x) or isinstance(x, str)):
            raise FilterError(f"{where}: anything-but takes strings or numbers; got {x!r} (quote yes/no/true/false "
                              "in YAML)")
        if isinstance(x, str):
            _text(where, "anything-but", x)
    return ("anything-but", tuple(items))
