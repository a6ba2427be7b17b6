"""Unit tests of sps.graph: stage specs and stage graphs, checked before anything runs.

A valid graph parses with its defaults and orders producers before consumers; every bad
input is refused with an `InvalidGraph` naming the place (stage or stream) and the
field; cycles are refused with the cycle named; YAML files load (and malformed ones are
refused); `resolve` names what it cannot load; StageSpec survives its byte encoding;
the shipped clickstream example parses. Product bugs these tests found (now fixed) are kept as regressions
at the end of the module.
"""

from __future__ import annotations

import copy
import re
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import limits
from sms.errors import InvalidArgument
from sps.graph import (
    ENGINES,
    RECOVERY_POLICIES,
    Graph,
    InvalidGraph,
    Output,
    StageSpec,
    StreamSpec,
    load_graph,
    parse_graph,
    parse_stage,
    resolve,
    topological_order,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CLICKSTREAM = REPO_ROOT / "examples" / "clickstream" / "graph.yaml"


def base_doc() -> dict:
    """A valid three-stage graph: parse -> count, parse -> archive (a sink)."""
    return {
        "streams": {
            "clicks": {"partitions": 4, "replication_factor": 2},
            "parsed": {"partitions": 4, "persistence": "memory"},
            "counts": {"partitions": 2},
            "bare": None,
        },
        "stages": {
            "parse": {
                "inputs": ["clicks"],
                "operation": "examples.clickstream:parse",
                "engine": "spark",
                "outputs": [{"stream": "parsed", "key": "user"}],
                "recovery": "checkpoint",
                "checkpoint_records": 1000,
                "checkpoint_interval_s": 5,
                "failover_s": 10,
            },
            "count": {
                "inputs": ["parsed"],
                "operation": "examples.clickstream:count_per_minute",
                "outputs": [{"stream": "counts", "key": "user"}],
            },
            "archive": {
                "inputs": "parsed",
                "operation": "mod:archive",
                "engine": "python",
                "sink": "mod:write_out",
                "recovery": "best_effort",
            },
        },
    }


def stage_doc(**overrides) -> dict:
    d = {"inputs": ["clicks"], "operation": "m:f", "outputs": [{"stream": "parsed", "key": "user"}]}
    for k, v in overrides.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()


def one_stage_graph(stage: dict, name: str = "parse", streams: dict | None = None) -> dict:
    return {"streams": streams if streams is not None else {"clicks": {}, "parsed": {}},
            "stages": {name: stage}}


def assert_edges_respected(stages: dict[str, StageSpec], order: list[str]) -> None:
    assert sorted(order) == sorted(stages), "order is not a permutation of the stages"
    pos = {name: i for i, name in enumerate(order)}
    for consumer in stages.values():
        for producer in stages.values():
            if producer.name != consumer.name and {o.stream for o in producer.outputs} & set(consumer.inputs):
                assert pos[producer.name] < pos[consumer.name], \
                    f"{producer.name} writes an input of {consumer.name} but comes after it in {order}"


# --- a valid graph ------------------------------------------------------------------------

def test_valid_graph_parses_with_streams_stages_and_defaults() -> None:
    g = parse_graph(base_doc())
    assert isinstance(g, Graph)
    assert g.streams == {
        "clicks": StreamSpec("clicks", 4, 2, "disk"),
        "parsed": StreamSpec("parsed", 4, 1, "memory"),
        "counts": StreamSpec("counts", 2, 1, "disk"),
        "bare": StreamSpec("bare", 1, 1, "disk"),
    }
    assert set(g.stages) == {"parse", "count", "archive"}
    parse = g.stages["parse"]
    assert parse == StageSpec(name="parse", inputs=("clicks",), operation="examples.clickstream:parse",
                              engine="spark", outputs=(Output("parsed", "user"),), sink="",
                              recovery="checkpoint", checkpoint_records=1000, checkpoint_interval_s=5.0,
                              failover_s=10.0)
    assert isinstance(parse.checkpoint_interval_s, float) and isinstance(parse.failover_s, float)
    assert isinstance(parse.checkpoint_records, int)
    count = g.stages["count"]                      # everything optional left to its default
    assert count.engine == "spark"
    assert count.recovery == "checkpoint"
    assert count.sink == ""
    assert count.checkpoint_records == limits.SPS_CHECKPOINT_RECORDS_DEFAULT
    assert count.checkpoint_interval_s == limits.SPS_CHECKPOINT_INTERVAL_S_DEFAULT
    assert count.failover_s == limits.SPS_FAILOVER_S_DEFAULT
    archive = g.stages["archive"]
    assert archive.inputs == ("parsed",)           # a single stream may be given as a string
    assert archive.outputs == ()
    assert archive.sink == "mod:write_out"
    assert archive.engine == "python" and archive.recovery == "best_effort"


def test_order_puts_producers_before_consumers() -> None:
    g = parse_graph(base_doc())
    order = g.order()
    assert order.index("parse") < order.index("count")
    assert order.index("parse") < order.index("archive")
    assert_edges_respected(g.stages, order)
    assert order == g.order()                      # deterministic


def test_output_shorthand_and_default_key() -> None:
    spec = parse_stage("s", {"inputs": ["a"], "operation": "m:f", "outputs": ["b", {"stream": "c"}]})
    assert spec.outputs == (Output("b", "partition_key"), Output("c", "partition_key"))


def test_parse_stage_without_known_streams_does_not_check_declarations() -> None:
    spec = parse_stage("s", {"inputs": ["anything"], "operation": "m:f", "sink": "m:g"})
    assert spec.inputs == ("anything",)


def test_boundary_values_are_accepted() -> None:
    lo = parse_stage("s", stage_doc(checkpoint_records=1, checkpoint_interval_s=0.05,
                                    failover_s=limits.SPS_FAILOVER_S_MIN))
    assert (lo.checkpoint_records, lo.checkpoint_interval_s, lo.failover_s) == (1, 0.05, limits.SPS_FAILOVER_S_MIN)
    hi = parse_stage("s", stage_doc(checkpoint_records=limits.SPS_BATCH_RECORDS_MAX,
                                    checkpoint_interval_s=limits.SPS_CHECKPOINT_INTERVAL_S_MAX, failover_s=3600))
    assert (hi.checkpoint_records, hi.checkpoint_interval_s, hi.failover_s) == (
        limits.SPS_BATCH_RECORDS_MAX, limits.SPS_CHECKPOINT_INTERVAL_S_MAX, 3600.0)


def test_every_engine_and_recovery_policy_is_accepted() -> None:
    for engine in ENGINES:
        for recovery in RECOVERY_POLICIES:
            spec = parse_stage("s", stage_doc(engine=engine, recovery=recovery))
            assert (spec.engine, spec.recovery) == (engine, recovery)


def test_stage_limit_is_inclusive() -> None:
    n = limits.STAGES_PER_GRAPH_MAX
    doc = {"streams": {"src": {}},
           "stages": {f"s{i}": {"inputs": ["src"], "operation": "m:f", "sink": "m:g"} for i in range(n)}}
    assert len(parse_graph(doc).stages) == n


def test_a_stage_has_a_dead_letter_stream() -> None:
    doc = {"streams": {"clicks": {}, "parsed": {}},
           "stages": {"parse": stage_doc(), "enrich": stage_doc(dead_letter="failed-enrich")}}
    stages = parse_graph(doc).stages
    assert stages["parse"].dead_letter_stream == "parse-dead-letters"
    assert stages["enrich"].dead_letter_stream == "failed-enrich"
    assert StageSpec.from_bytes(stages["enrich"].to_bytes()) == stages["enrich"]


def test_invalid_graph_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        parse_graph({"stages": {}})


# --- bad inputs: each refused with the place named -------------------------------------------

BAD_STAGES = [
    # (id, stage dict, substrings the message must contain)
    ("unknown-field", stage_doc(colour="red", size=3), ["stage 'parse'", "unknown field(s) colour, size"]),
    ("bad-dead-letter", stage_doc(dead_letter="no/slash"), ["stage 'parse'", "dead_letter must name a stream"]),
    ("dead-letter-not-a-string", stage_doc(dead_letter=7), ["stage 'parse'", "dead_letter must name a stream"]),
    ("dead-letter-is-an-input", stage_doc(dead_letter="clicks"), ["stage 'parse'", "is one of its inputs"]),
    ("missing-operation", stage_doc(operation=_DROP), ["stage 'parse'", "operation must be module:function"]),
    ("operation-not-module-function", stage_doc(operation="justafunction"), ["stage 'parse'", "operation"]),
    ("operation-not-a-string", stage_doc(operation=42), ["stage 'parse'", "operation"]),
    ("bad-engine", stage_doc(engine="flink"), ["stage 'parse'", "engine 'flink'", "spark, python"]),
    ("outputs-and-sink", stage_doc(sink="m:g"), ["stage 'parse'", "exactly one"]),
    ("neither-outputs-nor-sink", stage_doc(outputs=_DROP), ["stage 'parse'", "exactly one"]),
    ("empty-outputs-no-sink", stage_doc(outputs=[]), ["stage 'parse'", "exactly one"]),
    ("sink-not-module-function", stage_doc(outputs=_DROP, sink="nocolon"), ["stage 'parse'", "sink"]),
    ("sink-not-a-string", stage_doc(outputs=_DROP, sink=7), ["stage 'parse'", "sink"]),
    ("bad-recovery", stage_doc(recovery="retry"), ["stage 'parse'", "recovery 'retry'", "checkpoint, best_effort"]),
    ("checkpoint-records-zero", stage_doc(checkpoint_records=0), ["stage 'parse'", "checkpoint_records 0"]),
    ("checkpoint-records-too-many", stage_doc(checkpoint_records=limits.SPS_BATCH_RECORDS_MAX + 1),
     ["stage 'parse'", "checkpoint_records"]),
    ("checkpoint-records-bool", stage_doc(checkpoint_records=True), ["stage 'parse'", "checkpoint_records True"]),
    ("checkpoint-records-string", stage_doc(checkpoint_records="100"), ["stage 'parse'", "checkpoint_records"]),
    ("interval-too-small", stage_doc(checkpoint_interval_s=0.01), ["stage 'parse'", "checkpoint_interval_s 0.01"]),
    ("interval-too-large", stage_doc(checkpoint_interval_s=limits.SPS_CHECKPOINT_INTERVAL_S_MAX + 1),
     ["stage 'parse'", "checkpoint_interval_s"]),
    ("interval-nan", stage_doc(checkpoint_interval_s=float("nan")), ["stage 'parse'", "checkpoint_interval_s"]),
    ("failover-too-small", stage_doc(failover_s=limits.SPS_FAILOVER_S_MIN / 2), ["stage 'parse'", "failover_s"]),
    ("failover-too-large", stage_doc(failover_s=3601), ["stage 'parse'", "failover_s 3601"]),
    ("failover-inf", stage_doc(failover_s=float("inf")), ["stage 'parse'", "failover_s"]),
    ("undeclared-input", stage_doc(inputs=["nope"]), ["stage 'parse'", "stream 'nope' is not declared"]),
    ("undeclared-output", stage_doc(outputs=[{"stream": "nope"}]),
     ["stage 'parse'", "stream 'nope' is not declared"]),
    ("bad-input-name", stage_doc(inputs=["bad name!"]), ["stage 'parse'", "stream name"]),
    ("bad-output-name", stage_doc(outputs=[{"stream": "x" * (limits.STREAM_NAME_CHARS_MAX + 1)}]),
     ["stage 'parse'", "stream name"]),
    ("no-inputs", stage_doc(inputs=[]), ["stage 'parse'", "inputs"]),
    ("missing-inputs", stage_doc(inputs=_DROP), ["stage 'parse'", "inputs"]),
    ("non-string-input", stage_doc(inputs=["clicks", 3]), ["stage 'parse'", "inputs"]),
    ("output-unknown-field", stage_doc(outputs=[{"stream": "parsed", "colour": "red"}]),
     ["stage 'parse'", "output 0"]),
    ("output-without-stream", stage_doc(outputs=["parsed", {"key": "user"}]), ["stage 'parse'", "output 1"]),
    ("output-not-a-mapping", stage_doc(outputs=[["parsed"]]), ["stage 'parse'", "output 0"]),
    ("stage-not-a-mapping", ["clicks"], ["stage 'parse'", "mapping"]),
]


@pytest.mark.parametrize("stage, expected", [pytest.param(s, e, id=i) for i, s, e in BAD_STAGES])
def test_bad_stage_is_refused_naming_the_place(stage, expected) -> None:
    with pytest.raises(InvalidGraph) as info:
        parse_graph(one_stage_graph(copy.deepcopy(stage)))
    for part in expected:
        assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("name", ["bad name", "", "a/b", "x" * (limits.STREAM_NAME_CHARS_MAX + 1), 7])
def test_bad_stage_name_is_refused(name) -> None:
    with pytest.raises(InvalidGraph) as info:
        parse_graph(one_stage_graph(stage_doc(), name=name))
    assert f"stage {name!r}" in str(info.value)
    assert "stage name" in str(info.value)


BAD_STREAMS = [
    ("bad-name", {"bad name": {}}, ["stream 'bad name'", "stream name"]),
    ("unknown-field", {"clicks": {"partitions": 2, "colour": "red"}}, ["stream 'clicks'"]),
    ("not-a-mapping", {"clicks": 4}, ["stream 'clicks'"]),
    ("partitions-zero", {"clicks": {"partitions": 0}}, ["stream 'clicks'", "partitions 0"]),
    ("partitions-too-many", {"clicks": {"partitions": limits.STREAM_PARTITIONS_MAX + 1}},
     ["stream 'clicks'", "partitions"]),
    ("partitions-string", {"clicks": {"partitions": "4"}}, ["stream 'clicks'", "partitions"]),
    ("replication-too-high", {"clicks": {"replication_factor": limits.REPLICATION_FACTOR_MAX + 1}},
     ["stream 'clicks'", "replication_factor"]),
    ("replication-zero", {"clicks": {"replication_factor": 0}}, ["stream 'clicks'", "replication_factor 0"]),
]


@pytest.mark.parametrize("streams, expected", [pytest.param(s, e, id=i) for i, s, e in BAD_STREAMS])
def test_bad_stream_is_refused_naming_it(streams, expected) -> None:
    streams = {**streams, "parsed": {}}
    streams.setdefault("clicks", {})
    doc = {"streams": streams, "stages": {"parse": stage_doc()}}
    with pytest.raises(InvalidGraph) as info:
        parse_graph(doc)
    for part in expected:
        assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("doc, expected", [
    pytest.param({"streams": {}, "stages": {"a": stage_doc()}, "extra": 1}, "`streams` and `stages` only",
                 id="unknown-top-level-key"),
    pytest.param(None, "`streams` and `stages` only", id="none"),
    pytest.param(["stages"], "`streams` and `stages` only", id="list"),
    pytest.param({"streams": {"a": {}}}, "at least one stage", id="no-stages"),
    pytest.param({"streams": {"a": {}}, "stages": {}}, "at least one stage", id="empty-stages"),
    pytest.param({"streams": {"a": {}}, "stages": ["a"]}, "at least one stage", id="stages-list"),
])
def test_bad_graph_document_is_refused(doc, expected) -> None:
    with pytest.raises(InvalidGraph, match=re.escape(expected)):
        parse_graph(doc)


def test_too_many_stages_are_refused() -> None:
    n = limits.STAGES_PER_GRAPH_MAX + 1
    doc = {"streams": {"src": {}},
           "stages": {f"s{i}": {"inputs": ["src"], "operation": "m:f", "sink": "m:g"} for i in range(n)}}
    with pytest.raises(InvalidGraph, match=rf"^{n} stages; at most {limits.STAGES_PER_GRAPH_MAX}$"):
        parse_graph(doc)


# --- cycles -------------------------------------------------------------------------------

def chain_stage(inp: str, out: str) -> dict:
    return {"inputs": [inp], "operation": "m:f", "outputs": [{"stream": out}]}


def cycle_in_message(message: str) -> list[str]:
    m = re.fullmatch(r"the stage graph has a cycle: (.+)", message)
    assert m, f"not a cycle message: {message!r}"
    return m.group(1).split(" -> ")


def assert_names_cycle(message: str, stages: dict[str, StageSpec], members: set[str]) -> list[str]:
    """The message names exactly `members` as a closed path of dependency edges."""
    named = cycle_in_message(message)
    assert named[0] == named[-1], f"the cycle does not close: {named}"
    assert set(named) == members and len(named) == len(members) + 1, named
    writes = {s.name: {o.stream for o in s.outputs} for s in stages.values()}
    reads = {s.name: set(s.inputs) for s in stages.values()}
    hops = list(zip(named, named[1:]))
    # one direction for the whole path: x -> y means x reads what y writes, or x writes what y reads
    consumer_first = all(reads[x] & writes[y] for x, y in hops)
    producer_first = all(writes[x] & reads[y] for x, y in hops)
    assert consumer_first or producer_first, f"{named} is not a path of the graph"
    return named


def test_two_stage_cycle_is_refused_and_named() -> None:
    doc = {"streams": {"x": {}, "y": {}}, "stages": {"a": chain_stage("x", "y"), "b": chain_stage("y", "x")}}
    with pytest.raises(InvalidGraph) as info:
        parse_graph(doc)
    assert str(info.value) == "the stage graph has a cycle: a -> b -> a"


def test_self_loop_is_refused_and_named() -> None:
    doc = {"streams": {"x": {}}, "stages": {"a": chain_stage("x", "x")}}
    with pytest.raises(InvalidGraph, match=r"^the stage graph has a cycle: a -> a$"):
        parse_graph(doc)


def test_one_of_two_overlapping_cycles_is_named() -> None:
    # data flows a -> b -> c -> a and a -> b -> y -> z -> a: either named cycle must be a real one
    doc = {"streams": {s: {} for s in ("s0", "s1", "s2", "back", "side")},
           "stages": {"a": {"inputs": ["s0", "back"], "operation": "m:f", "outputs": ["s1"]},
                      "b": chain_stage("s1", "s2"),
                      "c": chain_stage("s2", "s0"),
                      "y": chain_stage("s2", "side"),
                      "z": chain_stage("side", "back")}}
    with pytest.raises(InvalidGraph) as info:
        parse_graph(doc)
    stages = {n: parse_stage(n, d) for n, d in doc["stages"].items()}
    named = cycle_in_message(str(info.value))
    assert set(named) in ({"a", "b", "c"}, {"a", "b", "y", "z"})
    assert_names_cycle(str(info.value), stages, set(named))


def test_longer_cycle_with_acyclic_neighbours_names_only_the_cycle() -> None:
    # data flows p -> a -> b -> c -> a, and c -> q: p and q are not on the cycle
    doc = {"streams": {s: {} for s in ("in", "s0", "s1", "s2", "out", "fin")},
           "stages": {"p": chain_stage("in", "s0"),
                      "a": chain_stage("s0", "s1"),
                      "b": chain_stage("s1", "s2"),
                      "c": {"inputs": ["s2"], "operation": "m:f", "outputs": ["s0", "out"]},
                      "q": chain_stage("out", "fin")}}
    with pytest.raises(InvalidGraph) as info:
        parse_graph(doc)
    stages = {n: parse_stage(n, d) for n, d in doc["stages"].items()}
    assert_names_cycle(str(info.value), stages, {"a", "b", "c"})


def test_topological_order_directly_on_specs() -> None:
    stages = {n: parse_stage(n, d) for n, d in {"a": chain_stage("x", "y"), "b": chain_stage("y", "x")}.items()}
    with pytest.raises(InvalidGraph, match="cycle: a -> b -> a"):
        topological_order(stages)
    assert topological_order({}) == []


@st.composite
def dags(draw):
    """Stages s_i writing stream o_i and reading a subset of o_j (j < i) or the source,
    under shuffled names so the order is not the sorted one by accident."""
    n = draw(st.integers(1, 12))
    names = draw(st.permutations([f"st{k}" for k in range(n)]))
    doc = {"streams": {"src": {}, **{f"o{i}": {} for i in range(n)}}, "stages": {}}
    for i in range(n):
        ins = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        inputs = [f"o{j}" for j in ins] or ["src"]
        doc["stages"][names[i]] = {"inputs": inputs, "operation": "m:f", "outputs": [{"stream": f"o{i}"}]}
    return doc


@settings(max_examples=150)
@given(dags())
def test_any_dag_orders_producers_first(doc) -> None:
    g = parse_graph(doc)
    assert_edges_respected(g.stages, g.order())


@settings(max_examples=100)
@given(dags(), st.data())
def test_any_back_edge_makes_a_named_cycle(doc, data) -> None:
    # make some stage read the output of itself or of a stage downstream of it
    g = parse_graph(doc)
    order = g.order()
    i = data.draw(st.integers(0, len(order) - 1))
    j = data.draw(st.integers(i, len(order) - 1))
    down = g.stages[order[j]].outputs[0].stream
    up = order[i]
    doc["stages"][up]["inputs"] = doc["stages"][up]["inputs"] + [down]
    # is there a path up -> ... -> order[j]? (always when i == j)
    stages = {n: parse_stage(n, d) for n, d in doc["stages"].items()}
    try:
        topological_order(stages)
    except InvalidGraph as e:
        named = cycle_in_message(str(e))
        assert_names_cycle(str(e), stages, set(named))
        with pytest.raises(InvalidGraph):
            parse_graph(doc)
    else:
        assert i != j


# --- YAML files ----------------------------------------------------------------------------

def test_load_graph_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(yaml.safe_dump(base_doc()))
    assert load_graph(str(path)) == parse_graph(base_doc())


def test_load_graph_of_the_docstring_style_yaml(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        "streams:\n"
        "  clicks:  {partitions: 4, replication_factor: 2}\n"
        "  parsed:  {partitions: 4, persistence: memory}\n"
        "stages:\n"
        "  parse:\n"
        "    inputs: [clicks]\n"
        "    operation: examples.clickstream:parse\n"
        "    outputs: [{stream: parsed, key: user}]\n"
        "    checkpoint_interval_s: 0.5\n")
    g = load_graph(str(path))
    assert g.stages["parse"].outputs == (Output("parsed", "user"),)
    assert g.stages["parse"].checkpoint_interval_s == 0.5
    assert g.streams["parsed"].persistence == "memory"


@pytest.mark.parametrize("text", [
    "stages: [a, b\n  c: ]\n",
    "streams:\n  a: {partitions: 1\nstages: {}\n",
    "key: value\n\tbad-indent: 1\n",
    "a: b: c\n",
])
def test_load_graph_of_malformed_yaml_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(InvalidGraph) as info:
        load_graph(str(path))
    assert str(info.value).startswith(f"{path}: ")


def test_load_graph_of_missing_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InvalidGraph) as info:
        load_graph(str(path))
    assert str(path) in str(info.value)


def test_load_graph_of_empty_or_scalar_yaml_is_refused(tmp_path: Path) -> None:
    for text in ("", "just a string\n", "- a\n- b\n"):
        path = tmp_path / "g.yaml"
        path.write_text(text)
        with pytest.raises(InvalidGraph, match="`streams` and `stages` only"):
            load_graph(str(path))


def test_load_graph_of_invalid_graph_in_valid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("streams: {a: {}}\nstages:\n  s: {inputs: [a], operation: m:f, sink: m:g, engine: flink}\n")
    with pytest.raises(InvalidGraph, match=r"stage 's': engine 'flink'"):
        load_graph(str(path))


def test_min_batch_records_is_checked_against_checkpoint_records() -> None:
    base = {"inputs": ["a"], "operation": "m:f", "outputs": ["b"], "checkpoint_records": 100}
    assert parse_stage("s", {**base, "min_batch_records": 100}).min_batch_records == 100
    assert parse_stage("s", base).min_batch_records == 0
    for bad in (101, -1, 1.5, "10", True):
        with pytest.raises(InvalidGraph, match="min_batch_records"):
            parse_stage("s", {**base, "min_batch_records": bad})


def test_clickstream_example_parses() -> None:
    g = load_graph(str(CLICKSTREAM))
    assert set(g.streams) == {"clicks", "clicks_by_user", "user_minutes"}
    assert g.streams["clicks"] == StreamSpec("clicks", 4, 2, "disk")
    assert g.streams["user_minutes"].partitions == 2
    assert g.order() == ["parse", "count"]
    parse = g.stages["parse"]
    assert parse.inputs == ("clicks",)
    assert parse.outputs == (Output("clicks_by_user", "user"),)
    assert parse.operation == "examples.clickstream.ops:parse"
    assert (parse.engine, parse.recovery, parse.checkpoint_records, parse.checkpoint_interval_s,
            parse.min_batch_records, parse.failover_s) == ("spark", "checkpoint", 10000, 2.0, 8000, 3.0)
    count = g.stages["count"]
    assert count.outputs == (Output("user_minutes", "user"),)
    assert count.state is not None and count.state.key == ("user",) and count.state.changelog == "count-changelog"
    for spec in g.stages.values():
        assert StageSpec.from_bytes(spec.to_bytes()) == spec


# --- resolve -------------------------------------------------------------------------------

@pytest.mark.parametrize("ref", ["nocolon", ":func", "os.path:", ""])
def test_resolve_refuses_a_malformed_reference(ref: str) -> None:
    with pytest.raises(InvalidGraph) as info:
        resolve(ref, "stage 'x' operation")
    assert str(info.value) == f"stage 'x' operation: {ref!r}; expected module:function"


def test_resolve_names_a_missing_module() -> None:
    ref = f"no_such_module_{uuid.uuid4().hex}:f"
    with pytest.raises(InvalidGraph) as info:
        resolve(ref, "stage 'x' sink")
    assert str(info.value).startswith(f"stage 'x' sink: cannot load {ref!r}: ")
    assert "No module named" in str(info.value)


def test_resolve_names_a_missing_function() -> None:
    with pytest.raises(InvalidGraph, match=r"^w: cannot load 'os.path:no_such_function': .*no_such_function"):
        resolve("os.path:no_such_function", "w")


def test_resolve_refuses_a_non_callable() -> None:
    with pytest.raises(InvalidGraph, match=r"^w: 'os:sep' is not callable$"):
        resolve("os:sep", "w")


def test_resolve_returns_the_callable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os.path
    assert resolve("os.path:join", "w") is os.path.join
    name = f"sps_graph_ops_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("def op(rows):\n    return [r * 2 for r in rows]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve(f"{name}:op", "w")([1, 2]) == [2, 4]


# --- StageSpec encoding --------------------------------------------------------------------

def test_stage_spec_round_trip_of_parsed_stages() -> None:
    for spec in parse_graph(base_doc()).stages.values():
        raw = spec.to_bytes()
        assert isinstance(raw, bytes)
        back = StageSpec.from_bytes(raw)
        assert back == spec
        assert isinstance(back.inputs, tuple) and isinstance(back.outputs, tuple)
        assert all(isinstance(o, Output) for o in back.outputs)


names = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)


@settings(max_examples=100)
@given(st.builds(
    StageSpec, name=names, inputs=st.lists(names, min_size=1, max_size=4).map(tuple),
    operation=st.tuples(names, names).map(":".join), engine=st.sampled_from(ENGINES),
    outputs=st.lists(st.builds(Output, stream=names, key=st.text(max_size=10)), max_size=3).map(tuple),
    sink=st.one_of(st.just(""), st.tuples(names, names).map(":".join)),
    recovery=st.sampled_from(RECOVERY_POLICIES), checkpoint_records=st.integers(1, limits.SPS_BATCH_RECORDS_MAX),
    checkpoint_interval_s=st.floats(0.05, limits.SPS_CHECKPOINT_INTERVAL_S_MAX),
    failover_s=st.floats(limits.SPS_FAILOVER_S_MIN, 3600)))
def test_stage_spec_round_trip_property(spec: StageSpec) -> None:
    assert StageSpec.from_bytes(spec.to_bytes()) == spec


# --- product bugs, pinned -------------------------------------------------------------------

def test_streams_section_that_is_a_list_is_invalid_graph() -> None:
    with pytest.raises(InvalidGraph):
        parse_graph({"streams": ["clicks", "parsed"], "stages": {"parse": stage_doc()}})


@pytest.mark.parametrize("outputs", ["parsed", {"stream": "parsed", "key": "user"}], ids=["string", "mapping"])
def test_outputs_not_a_list_is_refused_or_read_as_one_output(outputs) -> None:
    try:
        spec = parse_stage("s", {"inputs": ["clicks"], "operation": "m:f", "outputs": outputs})
    except InvalidGraph:
        return
    assert [o.stream for o in spec.outputs] == ["parsed"]


@pytest.mark.parametrize("field", ["inputs", "outputs"])
def test_non_iterable_inputs_or_outputs_are_invalid_graph(field: str) -> None:
    with pytest.raises(InvalidGraph, match="stage 's'"):
        parse_stage("s", {"inputs": ["a"], "operation": "m:f", "outputs": ["b"]} | {field: 5})


def test_bad_persistence_is_refused() -> None:
    doc = base_doc()
    doc["streams"]["counts"]["persistence"] = "banana"
    with pytest.raises(InvalidGraph, match="stream 'counts'"):
        parse_graph(doc)


@pytest.mark.parametrize("where", ["partitions", "checkpoint_records"])
def test_fractional_counts_are_refused(where: str) -> None:
    doc = base_doc()
    if where == "partitions":
        doc["streams"]["clicks"]["partitions"] = 2.7
    else:
        doc["stages"]["parse"]["checkpoint_records"] = 1.5
    with pytest.raises(InvalidGraph, match=where):
        parse_graph(doc)


def test_load_graph_of_non_utf8_file_is_invalid_graph(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81garbage: [\n")
    with pytest.raises(InvalidGraph, match=re.escape(str(path))):
        load_graph(str(path))


def test_resolve_of_a_module_with_a_syntax_error_is_invalid_graph(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"sps_graph_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("def op(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidGraph, match="cannot load"):
        resolve(f"{name}:op", "w")


def test_longer_cycle_is_named_in_data_flow_order() -> None:
    doc = {"streams": {"s0": {}, "s1": {}, "s2": {}},
           "stages": {"a": chain_stage("s0", "s1"), "b": chain_stage("s1", "s2"), "c": chain_stage("s2", "s0")}}
    with pytest.raises(InvalidGraph) as info:
        parse_graph(doc)
    assert str(info.value) == "the stage graph has a cycle: a -> b -> c -> a"
