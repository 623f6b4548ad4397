"""Labelled counters, histograms and scrape-time gauges, rendered in the Prometheus text
exposition format 0.0.4 byte for byte as prometheus_client's `generate_latest` renders the
same metrics, less its `_created` gauges.

Why not prometheus_client itself: importing it cost ~1 MiB of resident memory in the
server (its __init__ pulls in http.server, wsgiref, ...) and every `inc` / `observe` takes
a lock. The gateway serves from one thread, on one asyncio event loop: a child's
update here is a plain attribute or list update that no other thread can interleave with,
so it takes no lock. Do not update these metrics from other threads.

Tests parse the output with prometheus_client's own parser (tests/operations/).

Several workers (`gateway serve --workers N`, gateway/ops/worker_metrics.py): each family
gives its samples as plain data (`samples`), and renders its own merged with the other
workers' (`Registry.render(peers)`): counters and histogram buckets add, each gauge
combines as its `combine` says.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

INF = float("inf")


def format_value(value: float) -> str:
    """A sample value or bucket bound as prometheus_client writes it (its `floatToGoString`):
    Python's repr, `+Inf`/`-Inf`/`NaN`, and Go's exponent form from 1e7 up."""
    value = float(value)
    if value == INF:
        return "+Inf"
    if value == -INF:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")


def _label_string(pairs: Iterable[tuple[str, str]]) -> str:
    """`{a="x",b="y"}` with names sorted, as prometheus_client orders them; `` for none."""
    inner = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in sorted(pairs))
    return "{" + inner + "}" if inner else ""


# A family's samples as plain data: per tuple of label values, its value (a counter's or a
# gauge's number; a histogram's [per-bucket counts, sum]).
Samples = dict[tuple[str, ...], Any]
# Another worker's samples, as its socket sent them: per family name, [label values, value].
PeerSamples = Mapping[str, Sequence[tuple[Sequence[str], Any]]]


class Family(Protocol):
    name: str

    def samples(self) -> Samples:
        """This process's samples, as plain data."""

    def combine(self, mine: Any, theirs: Any) -> Any:
        """One sample of two workers as one."""

    def render_samples(self, out: list[str], samples: Samples) -> None:
        """Append the family's lines for `samples` (each ending in a newline) to `out`."""


class Collector(Protocol):
    def families(self) -> Iterable[Family]:
        """The families this collector renders, in order."""


_Child = TypeVar("_Child")


class _Family(Generic[_Child]):
    """A metric family with fixed label names and one child per tuple of label values, made
    by the first `labels(...)` call for that tuple and kept (label sets must be bounded)."""

    kind = ""
    suffix = ""  # counters are exposed as name_total

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[object, ...], _Child] = {}  # keys: label values, as str

    def _child(self, values: tuple[object, ...]) -> _Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
        return child

    def _new_child(self) -> _Child:
        raise NotImplementedError

    def _header(self, out: list[str]) -> None:
        name = self.name + self.suffix
        out.append(f"# HELP {name} {_escape_help(self.documentation)}\n")
        out.append(f"# TYPE {name} {self.kind}\n")

    def _pairs(self, samples: Samples) -> Iterator[tuple[list[tuple[str, str]], Any]]:
        """(label name/value pairs, value) per sample, in creation order."""
        for labels, value in samples.items():
            yield list(zip(self.labelnames, labels, strict=True)), value


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class Counter(_Family[CounterChild]):
    kind = "counter"
    suffix = "_total"

    def labels(self, *values: object) -> CounterChild:
        return self._child(values)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def families(self) -> Iterable[Family]:
        return (self,)

    def samples(self) -> Samples:
        return {cast("tuple[str, ...]", k): child.value for k, child in self._children.items()}

    combine = staticmethod(operator.add)

    def render_samples(self, out: list[str], samples: Samples) -> None:
        self._header(out)
        name = self.name + "_total"
        for pairs, value in self._pairs(samples):
            out.append(f"{name}{_label_string(pairs)} {format_value(value)}\n")


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative: summed at scrape
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount (the last bound is +Inf).
        # A NaN would land in the first bucket (prometheus_client counts it in none).
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class Histogram(_Family[HistogramChild]):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError("a histogram needs at least two buckets")
        if bounds[0] < 0:
            raise ValueError("negative bucket bounds are not supported (no _sum)")
        self.bounds = bounds
        self._le = [format_value(b) for b in bounds]

    def labels(self, *values: object) -> HistogramChild:
        return self._child(values)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def families(self) -> Iterable[Family]:
        return (self,)

    def samples(self) -> Samples:
        return {
            cast("tuple[str, ...]", k): [list(child.counts), child.sum]
            for k, child in self._children.items()
        }

    @staticmethod
    def combine(mine: Any, theirs: Any) -> Any:
        counts = [a + b for a, b in zip(mine[0], theirs[0], strict=True)]
        return [counts, mine[1] + theirs[1]]

    def render_samples(self, out: list[str], samples: Samples) -> None:
        self._header(out)
        name = self.name
        for pairs, (counts, total) in self._pairs(samples):
            cumulative = 0.0
            for le, count in zip(self._le, counts, strict=True):
                cumulative += count
                labels = _label_string([*pairs, ("le", le)])
                out.append(f"{name}_bucket{labels} {format_value(cumulative)}\n")
            labels = _label_string(pairs)
            out.append(f"{name}_count{labels} {format_value(cumulative)}\n")
            out.append(f"{name}_sum{labels} {format_value(total)}\n")


# How a gauge's value in two workers makes the server's: what each worker holds adds up
# (open holds, slots in use); what each sees of one shared thing takes the largest (the
# log's size) or the smallest (a node is up only if every worker finds it up).
GaugeCombine = Callable[[float, float], float]


class Gauge:
    """A gauge family read at scrape time: `read()` yields (label values, value) pairs."""

    def __init__(
        self,
        name: str,
        documentation: str,
        read: Callable[[], Iterable[tuple[Sequence[str], float]]],
        labelnames: Sequence[str] = (),
        combine: GaugeCombine = operator.add,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.read = read
        self.combine = combine

    @classmethod
    def single(
        cls,
        name: str,
        documentation: str,
        read: Callable[[], float],
        combine: GaugeCombine = operator.add,
    ) -> Gauge:
        """An unlabelled gauge of one value."""
        return cls(name, documentation, lambda: [((), read())], combine=combine)

    def families(self) -> Iterable[Family]:
        return (self,)

    def samples(self) -> Samples:
        return {tuple(values): value for values, value in self.read()}

    def render_samples(self, out: list[str], samples: Samples) -> None:
        out.append(f"# HELP {self.name} {_escape_help(self.documentation)}\n")
        out.append(f"# TYPE {self.name} gauge\n")
        for values, value in samples.items():
            pairs = zip(self.labelnames, values, strict=True)
            out.append(f"{self.name}{_label_string(pairs)} {format_value(value)}\n")


class Registry:
    """Collectors rendered in the order they were registered."""

    def __init__(self) -> None:
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self.collectors.append(collector)

    def families(self) -> Iterator[Family]:
        for collector in self.collectors:
            yield from collector.families()

    def samples(self) -> dict[str, list[tuple[tuple[str, ...], Any]]]:
        """Every family's samples as plain data: what a worker sends the others."""
        return {family.name: list(family.samples().items()) for family in self.families()}

    def render(self, peers: Sequence[PeerSamples] = ()) -> bytes:
        """The exposition of this process's samples, each added to the same sample of
        every peer (other workers); a sample only a peer has comes after ours."""
        out: list[str] = []
        for family in self.families():
            samples = family.samples()
            for peer in peers:
                for labels, value in peer.get(family.name, ()):
                    key = tuple(labels)
                    mine = samples.get(key)
                    samples[key] = value if mine is None else family.combine(mine, value)
            family.render_samples(out, samples)
        return "".join(out).encode("utf-8")
