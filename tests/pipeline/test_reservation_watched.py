"""Reservation, alone: a stream's hold is taken `watched` (its client may read its project
once the first byte is out), any other hold is not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from model_gateway.pipeline.context import STATE_KEY, RequestContext
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.memory import MemoryMeter, Project
from model_gateway.pipeline.reservation import Reservation
from tests.pipeline.test_settle import FlatPricing, answer


class RecordingMeter(MemoryMeter):
    def __init__(self) -> None:
        super().__init__({"p": Project("p", balance=1_000)}, {})
        self.watched: list[bool] = []

    async def reserve(self, project_id, key_id, amount, *, watched=False):
        self.watched.append(watched)
        return await super().reserve(project_id, key_id, amount)


@pytest.mark.parametrize(
    ("payload", "watched"),
    [
        (SimpleNamespace(stream=True), True),
        (SimpleNamespace(stream=False), False),
        (SimpleNamespace(), False),  # a sandbox execution: no stream field
    ],
)
async def test_only_a_streams_hold_is_watched(payload, watched):
    meter = RecordingMeter()
    ctx = RequestContext("req_1", Endpoint("POST", "/v1/x", "any", answer, pricing=FlatPricing()))
    ctx.project, ctx.payload = meter.projects["p"], payload

    async def inner(scope, receive, send):
        pass

    await Reservation(inner, meter=meter)({"type": "http", "state": {STATE_KEY: ctx}}, None, None)
    assert meter.watched == [watched]
    assert meter.open == {}  # released on the way out: nothing was settled
