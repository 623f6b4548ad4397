"""The settlement's span: the meter the traced /v1 path is given (tracing.Tracing.meter)
times each `settle` in a span under the request's, with the receipt it writes, its
outcome and cost. Reservations and releases pass straight through. The pipeline's hold
runs each meter call in a task of its own, made in the request's context, so the
request's trace is current there."""

from __future__ import annotations

from opentelemetry.trace import Tracer

from model_gateway.gateway.telemetry.conventions import mark_error
from model_gateway.gateway.telemetry.hooks import current_trace
from model_gateway.gateway.telemetry.request_trace import RequestTrace
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.errors import GatewayError, InternalError
from model_gateway.pipeline.ports import Meter, Reserved


class TracedMeter:
    def __init__(self, meter: Meter, tracer: Tracer) -> None:
        self.meter = meter
        self.tracer = tracer

    async def reserve(
        self, project_id: str, key_id: str | None, amount: int, *, watched: bool = False
    ) -> Reserved:
        return await self.meter.reserve(project_id, key_id, amount, watched=watched)

    async def release(self, reservation: Reserved) -> None:
        await self.meter.release(reservation)

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        trace = current_trace.get()
        if not isinstance(trace, RequestTrace):  # not a traced request's
            await self.meter.settle(reservation, settlement)
            return
        span = self.tracer.start_span(
            "settlement",
            context=trace.context,
            attributes={
                "gateway.receipt_id": settlement.receipt_id,
                "gateway.outcome": settlement.status,
                "gateway.cost": settlement.cost,  # micro-units (its usage is the request's)
            },
        )
        try:
            await self.meter.settle(reservation, settlement)
        except BaseException as exc:
            # Nothing committed: the client is answered internal_error (pipeline/settle.py).
            mark_error(span, exc.type if isinstance(exc, GatewayError) else InternalError.type)
            raise
        finally:
            span.end()
