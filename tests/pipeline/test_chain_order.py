"""The order of the stages, as `build_pipeline` builds it, is the table of the request path's
page (docs/request-path.md)."""

from __future__ import annotations

import re
from pathlib import Path

from model_gateway.pipeline import build_pipeline
from model_gateway.pipeline.dispatch import Dispatch
from model_gateway.pipeline.endpoint import RouteTable
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.memory import MemoryKeys, MemoryMeter, StaticCatalog
from model_gateway.pipeline.routing import Routing

PAGE = Path(__file__).resolve().parents[2] / "docs" / "request-path.md"


def documented_stages() -> list[str]:
    """The first column of the table at the top of the page (before its first section)."""
    section = PAGE.read_text().split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)


def walk(app) -> tuple[list[str], list[str]]:
    """(the keyed chain, the public chain), outermost first, each ending at its terminal."""
    outer = []
    while not isinstance(app, Routing):
        outer.append(type(app).__name__)
        app = app.app

    def follow(stage) -> list[str]:
        names = []
        while True:
            names.append(type(stage).__name__)
            if isinstance(stage, Dispatch):
                return names
            stage = stage.app

    return [*outer, "Routing", *follow(app.keyed)], [*outer, "Routing", *follow(app.public)]


def build(meter):
    return build_pipeline(
        routes=RouteTable([]),
        keys=MemoryKeys({}, {}),
        catalog=StaticCatalog({}),
        limiter=Gcra(),
        meter=meter,
        cors_origins=[],
        default_key_rpm=1,
        default_project_rpm=1,
    )


def test_the_keyed_chain_is_the_documented_table_with_metering_in():
    keyed, _ = walk(build(MemoryMeter({}, {})))
    stages = documented_stages()
    assert stages[-3:] == ["Reservation", "Settle", "Dispatch"]
    assert keyed == stages


def test_the_public_chain_goes_from_routing_straight_to_dispatch():
    _, public = walk(build(MemoryMeter({}, {})))
    assert public == ["RequestId", "Observe", "Cors", "Routing", "Dispatch"]


def test_without_a_meter_nothing_is_reserved_or_settled():
    keyed, _ = walk(build(None))
    assert keyed == [s for s in documented_stages() if s not in {"Reservation", "Settle"}]
