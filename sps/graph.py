"""Stages and stage graphs: what a YAML graph file says, checked before anything runs.

    streams:
      clicks:  {partitions: 4, replication_factor: 2}
      parsed:  {partitions: 4, persistence: memory}       # ephemeral
      counts:  {partitions: 2}
    stages:
      parse:
        inputs: [clicks]
        operation: examples.clickstream:parse           # module:function, assumed idempotent
        engine: spark                                   # spark (DataFrame -> DataFrame) or python
        outputs: [{stream: parsed, key: user}]          # or  sink: module:function
                                                        # an output may have a filter on the records' headers:
                                                        #   {stream: eu, key: user, filter: {region: [eu-west]}}
        recovery: checkpoint                            # or best_effort
        state: {key: [user], aggregates: {clicks: count}}   # keyed state: outputs are running totals
                                                        # (sps/state.py: windows, watermark, changelog)
        checkpoint_records: 1000
        checkpoint_interval_s: 5
        min_batch_records: 0                            # a partition's batch reads on to so many records while
                                                        # they keep coming (at most checkpoint_interval_s)
        failover_s: 10
      count:
        inputs: [parsed]
        operation: examples.clickstream:count_per_minute
        outputs: [{stream: counts, key: user}]

A stage reads its input streams, applies its operation to each batch of records and
writes the result to its output streams (the `key` column of a result row is its
partition key) or hands it to a sink callable. A stage whose input is another stage's
output depends on it; the graph must be a DAG (a cycle is refused, named). Every error
is a named `InvalidGraph` with the place it was found.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field

from sms import limits
from sms.errors import InvalidArgument, InvalidGraph
from sms.metadata import validate_stream_name
from sps.filters import FilterError, HeaderFilter, parse_filter
from sps.state import StateError, StateSpec, parse_state, spec_from_doc

RECOVERY_POLICIES = ("checkpoint", "best_effort")
PERSISTENCE = ("disk", "disk_async", "memory")
ENGINES = ("spark", "python")


@dataclass(frozen=True, slots=True)
class Output:
    stream: str
    key: str = "partition_key"        # the result column (spark) or dict key (python) used as partition key
    filter: HeaderFilter = HeaderFilter()   # on the output record's headers: the records this stream gets

    def to_doc(self) -> dict:
        d = {"stream": self.stream, "key": self.key}
        if self.filter:
            d["filter"] = self.filter.to_doc()
        return d


@dataclass(frozen=True, slots=True)
class StageSpec:
    name: str
    inputs: tuple[str, ...]
    operation: str                     # "module:function"
    engine: str = "spark"
    outputs: tuple[Output, ...] = ()
    sink: str = ""                     # "module:function", instead of outputs
    recovery: str = "checkpoint"
    checkpoint_records: int = limits.SPS_CHECKPOINT_RECORDS_DEFAULT
    checkpoint_interval_s: float = limits.SPS_CHECKPOINT_INTERVAL_S_DEFAULT
    min_batch_records: int = 0         # a partition's batch reads on to so many while they keep coming
    failover_s: float = limits.SPS_FAILOVER_S_DEFAULT
    dead_letter: str = ""              # the stream failed records go to ("": <name>-dead-letters)
    state: StateSpec | None = None     # keyed state (sps/state.py): the outputs are its running aggregates

    @property
    def dead_letter_stream(self) -> str:
        return self.dead_letter or f"{self.name}-dead-letters"

    def to_bytes(self) -> bytes:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("outputs", "state")}
        d["outputs"] = [o.to_doc() for o in self.outputs]
        d["state"] = self.state.to_doc() if self.state is not None else None
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StageSpec":
        d = json.loads(raw)
        d["inputs"] = tuple(d["inputs"])
        d["outputs"] = tuple(Output(o["stream"], o.get("key", "partition_key"), parse_filter(o.get("filter")))
                             for o in d["outputs"])
        d.setdefault("dead_letter", "")
        d.setdefault("min_batch_records", 0)
        d["state"] = spec_from_doc(d.get("state"), d["name"])
        return cls(**d)


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    persistence: str = "disk"


@dataclass(frozen=True, slots=True)
class Graph:
    streams: dict[str, StreamSpec] = field(default_factory=dict)
    stages: dict[str, StageSpec] = field(default_factory=dict)

    def order(self) -> list[str]:
        """Stage names, producers before consumers."""
        return topological_order(self.stages)


def resolve(ref: str, where: str):
    """The callable named by "module:function"; InvalidGraph if it cannot be imported."""
    module, _, func = ref.partition(":")
    if not module or not func:
        raise InvalidGraph(f"{where}: {ref!r}; expected module:function")
    try:
        obj = getattr(importlib.import_module(module), func)
    except Exception as e:          # ImportError, AttributeError, or whatever the module raises
        raise InvalidGraph(f"{where}: cannot load {ref!r}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise InvalidGraph(f"{where}: {ref!r} is not callable")
    return obj


def _number(d: dict, key: str, default, lo, hi, where: str, integer: bool = False):
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise InvalidGraph(f"{where}: {key} {value!r}; expected {lo}..{hi}")
    if integer and value != int(value):
        raise InvalidGraph(f"{where}: {key} {value!r}; expected a whole number")
    return value


def parse_stage(name: str, d: dict, known_streams: set[str] | None = None) -> StageSpec:
    where = f"stage {name!r}"
    if not isinstance(d, dict):
        raise InvalidGraph(f"{where}: expected a mapping")
    try:
        validate_stream_name(name)
    except InvalidArgument:
        raise InvalidGraph(f"{where}: a stage name is 1..{limits.STREAM_NAME_CHARS_MAX} of [A-Za-z0-9_.-]") from None
    unknown = set(d) - {"inputs", "operation", "engine", "outputs", "sink", "recovery", "checkpoint_records",
                        "checkpoint_interval_s", "min_batch_records", "failover_s", "dead_letter", "state"}
    if unknown:
        raise InvalidGraph(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    inputs = d.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise InvalidGraph(f"{where}: inputs must name one or more streams")
    operation = d.get("operation")
    if not isinstance(operation, str) or ":" not in operation:
        raise InvalidGraph(f"{where}: operation must be module:function")
    engine = d.get("engine", "spark")
    if engine not in ENGINES:
        raise InvalidGraph(f"{where}: engine {engine!r}; expected one of {', '.join(ENGINES)}")
    outputs = []
    raw_outputs = d.get("outputs") or []
    if isinstance(raw_outputs, (str, dict)):
        raw_outputs = [raw_outputs]
    if not isinstance(raw_outputs, list):
        raise InvalidGraph(f"{where}: outputs must be a list of {{stream: NAME, key: COLUMN}}")
    for i, o in enumerate(raw_outputs):
        if isinstance(o, str):
            o = {"stream": o}
        if not isinstance(o, dict) or not isinstance(o.get("stream"), str) or set(o) - {"stream", "key", "filter"} \
                or not isinstance(o.get("key", ""), str):
            raise InvalidGraph(f"{where}: output {i}: expected {{stream: NAME, key: COLUMN, filter: {{HEADER: [...]}}}}")
        try:
            header_filter = parse_filter(o.get("filter"))
        except FilterError as e:
            raise InvalidGraph(f"{where}: output {i} ({o['stream']}): filter: {e}") from None
        outputs.append(Output(o["stream"], o.get("key", "partition_key"), header_filter))
    sink = d.get("sink", "")
    if bool(outputs) == bool(sink):
        raise InvalidGraph(f"{where}: needs outputs or a sink (exactly one of them)")
    if sink and (not isinstance(sink, str) or ":" not in sink):
        raise InvalidGraph(f"{where}: sink must be module:function")
    recovery = d.get("recovery", "checkpoint")
    if recovery not in RECOVERY_POLICIES:
        raise InvalidGraph(f"{where}: recovery {recovery!r}; expected one of {', '.join(RECOVERY_POLICIES)}")
    for s in list(inputs) + [o.stream for o in outputs]:
        try:
            validate_stream_name(s)
        except InvalidArgument as e:
            raise InvalidGraph(f"{where}: {e.message}") from None
        if known_streams is not None and s not in known_streams:
            raise InvalidGraph(f"{where}: stream {s!r} is not declared under streams")
    dead_letter = d.get("dead_letter", "")
    if dead_letter:
        try:
            validate_stream_name(dead_letter)
        except (InvalidArgument, TypeError):
            raise InvalidGraph(f"{where}: dead_letter must name a stream") from None
        if dead_letter in inputs:
            raise InvalidGraph(f"{where}: dead_letter {dead_letter!r} is one of its inputs (a poison record would "
                               "come back for ever)")
    elif len(name) + len("-dead-letters") > limits.STREAM_NAME_CHARS_MAX:
        raise InvalidGraph(f"{where}: a name this long needs dead_letter: STREAM (its default is <name>-dead-letters)")
    state = None
    if d.get("state") is not None:
        try:
            state = parse_state(d["state"], name, where)
        except StateError as e:
            raise InvalidGraph(e.message) from None
        if recovery != "checkpoint":
            raise InvalidGraph(f"{where}: state needs recovery: checkpoint (its changelog follows the checkpoints)")
        if state.changelog in inputs or state.changelog in [o.stream for o in outputs] or state.changelog == \
                (dead_letter or f"{name}-dead-letters"):
            raise InvalidGraph(f"{where}: changelog {state.changelog!r} is one of the stage's other streams")
        try:
            validate_stream_name(state.changelog)
        except InvalidArgument as e:
            raise InvalidGraph(f"{where}: state: changelog: {e.message}") from None
        for o in outputs:
            if o.key not in state.output_columns:
                raise InvalidGraph(f"{where}: output {o.stream!r}: key {o.key!r} is not a column of the state's rows "
                                   f"({', '.join(state.output_columns)})")
            if o.filter:
                raise InvalidGraph(f"{where}: output {o.stream!r}: a stateful stage's rows carry no headers to filter")
    return StageSpec(
        name=name, inputs=tuple(inputs), operation=operation, engine=engine, outputs=tuple(outputs), sink=sink,
        recovery=recovery, dead_letter=dead_letter, state=state,
        checkpoint_records=int(_number(d, "checkpoint_records", limits.SPS_CHECKPOINT_RECORDS_DEFAULT, 1,
                                       limits.SPS_BATCH_RECORDS_MAX, where, integer=True)),
        checkpoint_interval_s=float(_number(d, "checkpoint_interval_s", limits.SPS_CHECKPOINT_INTERVAL_S_DEFAULT,
                                            0.05, limits.SPS_CHECKPOINT_INTERVAL_S_MAX, where)),
        min_batch_records=int(_number(d, "min_batch_records", 0, 0, d.get("checkpoint_records",
                                      limits.SPS_CHECKPOINT_RECORDS_DEFAULT), where, integer=True)),
        failover_s=float(_number(d, "failover_s", limits.SPS_FAILOVER_S_DEFAULT, limits.SPS_FAILOVER_S_MIN,
                                 3600, where)))


def topological_order(stages: dict[str, StageSpec]) -> list[str]:
    """Stages in dependency order (a stage after the stages writing its inputs); a cycle
    raises InvalidGraph naming it, e.g. "a -> b -> a"."""
    writers: dict[str, list[str]] = {}
    for s in stages.values():
        for o in s.outputs:
            writers.setdefault(o.stream, []).append(s.name)
    deps = {name: sorted({w for i in s.inputs for w in writers.get(i, [])}) for name, s in stages.items()}
    order: list[str] = []
    state: dict[str, int] = {}          # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            # (the walk follows inputs back to their writers: name it in the data's direction)
            raise InvalidGraph("the stage graph has a cycle: " + " -> ".join(reversed(cycle)))
        state[name] = 1
        path.append(name)
        for d in deps[name]:
            visit(d)
        path.pop()
        state[name] = 2
        order.append(name)

    for name in sorted(stages):
        visit(name)
    return order


def parse_graph(doc: dict) -> Graph:
    if not isinstance(doc, dict) or set(doc) - {"streams", "stages"}:
        raise InvalidGraph("a graph has `streams` and `stages` only")
    streams: dict[str, StreamSpec] = {}
    streams_doc = doc.get("streams") or {}
    if not isinstance(streams_doc, dict):
        raise InvalidGraph("`streams` must map stream names to {partitions, replication_factor, persistence}")
    for name, d in streams_doc.items():
        d = d or {}
        where = f"stream {name!r}"
        try:
            validate_stream_name(name)
        except InvalidArgument as e:
            raise InvalidGraph(f"{where}: {e.message}") from None
        if not isinstance(d, dict) or set(d) - {"partitions", "replication_factor", "persistence"}:
            raise InvalidGraph(f"{where}: expected {{partitions, replication_factor, persistence}}")
        persistence = d.get("persistence", "disk")
        if persistence not in PERSISTENCE:
            raise InvalidGraph(f"{where}: persistence {persistence!r}; expected one of {', '.join(PERSISTENCE)}")
        streams[name] = StreamSpec(
            name, int(_number(d, "partitions", 1, 1, limits.STREAM_PARTITIONS_MAX, where, integer=True)),
            int(_number(d, "replication_factor", 1, 1, limits.REPLICATION_FACTOR_MAX, where, integer=True)),
            persistence)
    stages_doc = doc.get("stages") or {}
    if not isinstance(stages_doc, dict) or not stages_doc:
        raise InvalidGraph("a graph needs at least one stage")
    if len(stages_doc) > limits.STAGES_PER_GRAPH_MAX:
        raise InvalidGraph(f"{len(stages_doc)} stages; at most {limits.STAGES_PER_GRAPH_MAX}")
    stages = {name: parse_stage(name, d, set(streams)) for name, d in stages_doc.items()}
    used = {s: name for name, st in stages.items() for s in st.inputs + tuple(o.stream for o in st.outputs)
            + (st.dead_letter_stream,)}
    changelogs: dict[str, str] = {}
    for name, st in stages.items():
        if st.state is None:
            continue
        log = st.state.changelog
        if log in changelogs:
            raise InvalidGraph(f"stage {name!r}: changelog {log!r} is stage {changelogs[log]!r}'s changelog too "
                               "(each stateful stage needs its own)")
        if log in used:
            raise InvalidGraph(f"stage {name!r}: changelog {log!r} is a stream of stage {used[log]!r}")
        changelogs[log] = name
    topological_order(stages)
    return Graph(streams, stages)


def load_graph(path: str) -> Graph:
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InvalidGraph(f"{path}: {e}") from None
    return parse_graph(doc)
