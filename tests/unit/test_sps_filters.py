"""Unit tests of sps.filters: header filters of stage outputs (SNS filter policies on headers).

Each condition kind matches and refuses; names AND, conditions within a name OR; absent
headers match only `exists: false`; values that are not UTF-8 match only `exists: true`;
numbers compare by value ("100.0" == 100) and odd number texts match no numeric
condition; the empty filter matches everything; a filter survives `to_doc` and is
hashable; every malformed filter is refused with a `FilterError` naming the header.
"""

from __future__ import annotations

import json

import pytest
import yaml

from sms import limits
from sps.filters import FILTER_HEADERS_MAX, FILTER_VALUES_MAX, FilterError, HeaderFilter, parse_filter


def matches(doc: dict, headers: dict[str, bytes] | None) -> bool:
    return parse_filter(doc).matches(headers)


# --- conditions ------------------------------------------------------------------------

def test_exact_string_is_any_of_the_list():
    f = parse_filter({"region": ["eu-west", "eu-north"]})
    assert f.matches({"region": b"eu-west"})
    assert f.matches({"region": b"eu-north"})
    assert not f.matches({"region": b"us-east"})
    assert not f.matches({"region": b"eu-west "})
    assert not f.matches({"region": b"EU-WEST"})


def test_exact_empty_string_matches_an_empty_value_only():
    assert matches({"a": [""]}, {"a": b""})
    assert not matches({"a": [""]}, {"a": b"x"})
    assert not matches({"a": [""]}, {})


def test_exact_number_compares_by_value():
    f = parse_filter({"amount": [100]})
    for text in (b"100", b"100.0", b"1e2", b"+100", b"100."):
        assert f.matches({"amount": text}), text
    for text in (b"100.5", b"99", b"abc", b""):
        assert not f.matches({"amount": text}), text
    assert matches({"ratio": [0.1]}, {"ratio": b"0.1"})


def test_exact_string_of_digits_compares_as_text():
    assert matches({"amount": ["100"]}, {"amount": b"100"})
    assert not matches({"amount": ["100"]}, {"amount": b"100.0"})


@pytest.mark.parametrize("text", [b"nan", b"inf", b"-Infinity", b"1_000", b" 100", b"100 ", b"0x64", b"1e999",
                                  "\u0661\u0660\u0660".encode()])
def test_odd_number_texts_match_no_numeric_condition(text):
    f = parse_filter({"n": [{"numeric": [">", -1e300]}, 1000, 100]})
    assert not f.matches({"n": text})


def test_prefix_and_suffix():
    f = parse_filter({"region": [{"prefix": "eu-"}], "file": [{"suffix": ".gz"}, {"suffix": ".zst"}]})
    assert f.matches({"region": b"eu-west", "file": b"a.gz"})
    assert f.matches({"region": b"eu-", "file": b"a.zst"})
    assert not f.matches({"region": b"us-east", "file": b"a.gz"})
    assert not f.matches({"region": b"eu-west", "file": b"a.gz.tmp"})


def test_anything_but_list_and_single():
    f = parse_filter({"env": [{"anything-but": ["test", "dev"]}]})
    assert f.matches({"env": b"prod"})
    assert f.matches({"env": b""})
    assert not f.matches({"env": b"test"})
    assert not f.matches({"env": b"dev"})
    assert not f.matches({})
    g = parse_filter({"env": [{"anything-but": "test"}]})
    assert g.matches({"env": b"dev"}) and not g.matches({"env": b"test"})


def test_anything_but_numbers_compare_by_value():
    f = parse_filter({"code": [{"anything-but": [0, "none"]}]})
    assert f.matches({"code": b"1"})
    assert f.matches({"code": b"zero"})
    assert not f.matches({"code": b"0.0"})
    assert not f.matches({"code": b"none"})


def test_anything_but_prefix():
    f = parse_filter({"stream": [{"anything-but": {"prefix": "tmp-"}}]})
    assert f.matches({"stream": b"clicks"})
    assert not f.matches({"stream": b"tmp-1"})
    assert not f.matches({})


def test_exists_true_and_false():
    present = parse_filter({"trace": [{"exists": True}]})
    absent = parse_filter({"trace": [{"exists": False}]})
    assert present.matches({"trace": b""}) and not present.matches({"other": b"x"})
    assert absent.matches({"other": b"x"}) and not absent.matches({"trace": b""})
    assert absent.matches(None) and absent.matches({})


def test_exists_false_or_a_value():
    f = parse_filter({"env": [{"exists": False}, "prod"]})
    assert f.matches({})
    assert f.matches({"env": b"prod"})
    assert not f.matches({"env": b"test"})


@pytest.mark.parametrize("bounds, inside, outside", [
    (["=", 5], [b"5", b"5.0"], [b"4.9", b"6"]),
    (["<", 5], [b"4.99", b"-7"], [b"5", b"6"]),
    (["<=", 5], [b"5", b"-1e3"], [b"5.01"]),
    ([">", 5], [b"5.01", b"1e9"], [b"5", b"0"]),
    ([">=", 5], [b"5", b"6"], [b"4.999"]),
    ([">", 0, "<=", 5], [b"0.001", b"5"], [b"0", b"5.1", b"-1"]),
    ([">=", 0, "<", 5], [b"0", b"4.9"], [b"5", b"-0.1"]),
])
def test_numeric(bounds, inside, outside):
    f = parse_filter({"n": [{"numeric": bounds}]})
    for text in inside:
        assert f.matches({"n": text}), (bounds, text)
    for text in outside:
        assert not f.matches({"n": text}), (bounds, text)
    assert not f.matches({"n": b"five"})
    assert not f.matches({})


# --- combining, absent headers, bytes ---------------------------------------------------

def test_names_and_conditions_or():
    f = parse_filter({"type": ["order", "refund"], "amount": [{"numeric": [">=", 100]}]})
    assert f.matches({"type": b"order", "amount": b"100", "extra": b"x"})
    assert f.matches({"type": b"refund", "amount": b"250.5"})
    assert not f.matches({"type": b"order", "amount": b"99"})
    assert not f.matches({"type": b"click", "amount": b"500"})
    assert not f.matches({"type": b"order"})


def test_mixed_conditions_in_one_list_or():
    f = parse_filter({"v": ["a", {"prefix": "b-"}, {"suffix": "-c"}, 7, {"numeric": [">", 100]},
                            {"anything-but": {"prefix": "x"}}]})
    for text in (b"a", b"b-1", b"1-c", b"7.0", b"101", b"zzz"):
        assert f.matches({"v": text}), text
    assert not f.matches({"v": b"xa"})


def test_absent_header_matches_only_exists_false():
    for doc in (["a"], [1], [{"prefix": "a"}], [{"suffix": "a"}], [{"anything-but": "a"}],
                [{"anything-but": {"prefix": "a"}}], [{"numeric": [">", 0]}], [{"exists": True}]):
        assert not matches({"h": doc}, {}), doc
        assert not matches({"h": doc}, None), doc


def test_non_utf8_value_matches_only_exists_true():
    bad = {"h": b"\xff\xfe"}
    assert matches({"h": [{"exists": True}]}, bad)
    for doc in (["\xff\xfe"], [{"anything-but": "a"}], [{"anything-but": {"prefix": "a"}}], [{"exists": False}],
                [{"prefix": "\xff"}], [{"numeric": [">", 0]}]):
        assert not matches({"h": doc}, bad), doc


def test_utf8_values_compare_as_text():
    assert matches({"city": ["Zürich"]}, {"city": "Zürich".encode()})
    assert matches({"city": [{"prefix": "Zü"}]}, {"city": bytearray("Zürich".encode())})
    assert matches({"city": [{"suffix": "ich"}]}, {"city": memoryview("Zürich".encode())})


def test_empty_filter_matches_everything():
    for f in (parse_filter(None), parse_filter({}), HeaderFilter()):
        assert not f
        assert f.matches(None) and f.matches({}) and f.matches({"h": b"\xff"})
        assert f.to_doc() == {}
    assert parse_filter({"h": ["x"]})


# --- form: round trip, equality, YAML ------------------------------------------------------

STAGE_YAML = """
outputs:
  - {stream: eu-clicks, key: user, filter: {region: [eu-west, eu-north]}}
  - {stream: big-orders, key: user, filter: {type: [order], amount: [{numeric: [">=", 100]}]}}
  - {stream: not-test, key: user, filter: {env: [{anything-but: [test, dev]}]}}
  - {stream: has-trace, key: user, filter: {trace: [{exists: true}], region: [{prefix: eu-}]}}
"""


def test_yaml_outputs_parse_and_route():
    filters = {o["stream"]: parse_filter(o["filter"]) for o in yaml.safe_load(STAGE_YAML)["outputs"]}
    headers = {"region": b"eu-west", "type": b"order", "amount": b"120", "env": b"prod"}
    assert {s for s, f in filters.items() if f.matches(headers)} == {"eu-clicks", "big-orders", "not-test"}
    assert {s for s, f in filters.items() if f.matches({**headers, "trace": b"t1", "env": b"dev"})} == {
        "eu-clicks", "big-orders", "has-trace"}


def test_to_doc_round_trips_through_json():
    doc = {"v": ["a", 7, 0.5, {"prefix": "p"}, {"suffix": "s"}, {"anything-but": ["x", 3]},
                 {"anything-but": {"prefix": "tmp"}}, {"exists": False}, {"numeric": [">", 0, "<=", 5]},
                 {"numeric": ["=", 2]}],
           "w": [{"exists": True}]}
    f = parse_filter(doc)
    assert f.to_doc() == doc
    assert parse_filter(f.to_doc()) == f
    assert parse_filter(json.loads(json.dumps(f.to_doc()))) == f
    assert "HeaderFilter(" in repr(f) and "'anything-but'" in repr(f)


def test_anything_but_single_normalises_to_a_list():
    f = parse_filter({"env": [{"anything-but": "test"}]})
    assert f.to_doc() == {"env": [{"anything-but": ["test"]}]}
    assert parse_filter(f.to_doc()) == f


def test_equal_and_hashable_up_to_name_order():
    a = parse_filter({"x": ["1"], "y": [{"prefix": "p"}]})
    b = parse_filter({"y": [{"prefix": "p"}], "x": ["1"]})
    c = parse_filter({"x": ["2"], "y": [{"prefix": "p"}]})
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c, HeaderFilter(), parse_filter({})}) == 3
    assert list(a.to_doc()) == ["x", "y"] == list(b.to_doc())


def test_at_the_limits():
    names = {f"h{i}": [str(j) for j in range(FILTER_VALUES_MAX)] for i in range(FILTER_HEADERS_MAX)}
    f = parse_filter(names)
    assert f.matches({f"h{i}": b"99" for i in range(FILTER_HEADERS_MAX)})
    assert not f.matches({f"h{i}": b"100" for i in range(FILTER_HEADERS_MAX)})
    assert parse_filter({"n" * limits.RECORD_HEADER_NAME_BYTES_MAX: ["v" * limits.RECORD_HEADERS_BYTES_MAX]})


# --- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("doc, message", [
    (["region"], "a filter maps header names to lists of conditions; got ['region']"),
    ("region", "a filter maps header names to lists of conditions"),
    ({f"h{i}": ["x"] for i in range(FILTER_HEADERS_MAX + 1)},
     f"a filter names at most {FILTER_HEADERS_MAX} headers; got {FILTER_HEADERS_MAX + 1}"),
    ({True: ["x"]}, "header name True: expected text (quote it in YAML)"),
    ({1: ["x"]}, "header name 1: expected text"),
    ({"": ["x"]}, f"header '': a header name is 1..{limits.RECORD_HEADER_NAME_BYTES_MAX} bytes of UTF-8"),
    ({"é" * 33: ["x"]}, "a header name is 1.."),
])
def test_refused_filter_shapes(doc, message):
    with pytest.raises(FilterError) as e:
        parse_filter(doc)
    assert message in str(e.value)


@pytest.mark.parametrize("conditions, message", [
    ("eu-west", "header 'h': expected a non-empty list of conditions; got 'eu-west'"),
    ([], "header 'h': expected a non-empty list of conditions; got []"),
    (None, "header 'h': expected a non-empty list of conditions; got None"),
    ({"prefix": "a"}, "header 'h': expected a non-empty list of conditions"),
    (["x"] * (FILTER_VALUES_MAX + 1), f"header 'h': at most {FILTER_VALUES_MAX} conditions; got "
                                      f"{FILTER_VALUES_MAX + 1}"),
    ([True], "header 'h': a condition is a string, a number or a {key: argument} mapping; got True"),
    ([False], "header 'h': a condition is a string, a number or a {key: argument} mapping; got False"),
    ([None], "header 'h': a condition is a string"),
    ([["a"]], "header 'h': a condition is a string"),
    ([float("nan")], "header 'h': a condition is a string"),
    ([float("inf")], "header 'h': a condition is a string"),
    ([10 ** 400], "header 'h': a condition is a string"),
    (["v" * (limits.RECORD_HEADERS_BYTES_MAX + 1)],
     f"header 'h': a value of {limits.RECORD_HEADERS_BYTES_MAX + 1} bytes; a header value has at most"),
    ([{}], "header 'h': a condition mapping has exactly one key; got {}"),
    ([{"prefix": "a", "suffix": "b"}], "header 'h': a condition mapping has exactly one key"),
    ([{"contains": "a"}],
     "header 'h': unknown condition 'contains'; expected one of prefix, suffix, anything-but, exists, numeric"),
    ([{"prefix": 1}], "header 'h': prefix needs a string; got 1"),
    ([{"suffix": None}], "header 'h': suffix needs a string; got None"),
    ([{"prefix": ""}], "header 'h': prefix needs a non-empty string (for any value use {exists: true})"),
    ([{"exists": "yes"}], "header 'h': exists needs true or false; got 'yes'"),
    ([{"exists": 1}], "header 'h': exists needs true or false; got 1"),
])
def test_refused_conditions(conditions, message):
    with pytest.raises(FilterError) as e:
        parse_filter({"h": conditions})
    assert message in str(e.value)


@pytest.mark.parametrize("arg, message", [
    ([">="], "header 'amount': numeric needs [op, number] or [op, number, op, number]; got ['>=']"),
    (">= 100", "numeric needs [op, number] or [op, number, op, number]; got '>= 100'"),
    ([">", 1, "<"], "numeric needs [op, number] or [op, number, op, number]"),
    ([">", "100"], "numeric needs [op, number] or [op, number, op, number]; got ['>', '100']"),
    ([">", True], "numeric needs [op, number] or [op, number, op, number]"),
    ([100, ">"], "numeric needs [op, number] or [op, number, op, number]"),
    (["!=", 1], "header 'amount': numeric operator '!='; expected one of =, <, <=, >, >="),
    (["<", 5, ">", 1], "header 'amount': a numeric range is a lower bound (> or >=) then an upper bound (< or <=)"),
    (["=", 1, "<", 5], "a numeric range is a lower bound"),
    ([">", 5, "<", 5], "header 'amount': numeric range ['>', 5, '<', 5]: the lower bound must be below the upper"),
])
def test_refused_numeric(arg, message):
    with pytest.raises(FilterError) as e:
        parse_filter({"amount": [{"numeric": arg}]})
    assert message in str(e.value)


@pytest.mark.parametrize("arg, message", [
    ([], f"header 'env': anything-but needs 1..{FILTER_VALUES_MAX} strings or numbers; got []"),
    (["x"] * (FILTER_VALUES_MAX + 1), f"anything-but needs 1..{FILTER_VALUES_MAX} strings or numbers"),
    ([True], "header 'env': anything-but takes strings or numbers; got True"),
    (None, "header 'env': anything-but takes strings or numbers; got None"),
    ([["a"]], "anything-but takes strings or numbers; got ['a']"),
    ({"suffix": "a"}, "header 'env': anything-but takes a string, a number, a list of them or {prefix: STRING}"),
    ({"prefix": ""}, "header 'env': anything-but prefix needs a non-empty string"),
    ({"prefix": 3}, "header 'env': anything-but prefix needs a string; got 3"),
])
def test_refused_anything_but(arg, message):
    with pytest.raises(FilterError) as e:
        parse_filter({"env": [{"anything-but": arg}]})
    assert message in str(e.value)


def test_yaml_bools_are_refused_with_a_hint():
    with pytest.raises(FilterError, match=r"header 'enabled': .*got False \(quote yes/no/true/false in YAML\)"):
        parse_filter(yaml.safe_load("{enabled: [no]}"))
    assert parse_filter(yaml.safe_load("{enabled: ['no']}")).matches({"enabled": b"no"})


def test_filter_error_is_a_value_error():
    assert issubclass(FilterError, ValueError)
