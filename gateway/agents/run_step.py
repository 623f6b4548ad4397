"""One step of a run, metered exactly like the same call on /v1, plus the run's budget.

A step is a request to one of the gateway's own endpoints (`POST /v1/chat/completions`
for a model step, `POST /v1/sandbox/executions` for a sandbox step), run without HTTP:
decoded and admitted as the policy and admission stages would, priced by the endpoint's
pricing (its hold), then

1. admitted against the run's remaining budget (`storage.begin_step`, one statement),
2. held against the project (`Hold.take`, no key: the project's balance and budget),
3. handed to the endpoint's handler,
4. settled through the hold (`settlement_of`, as the settle stage does): the receipt's
   insertion charges the project and adds the cost to the run's `spent`, atomically,
5. described: its usage, error and transcript (`transcript`: what was sent and answered).

Whatever happens the hold is released unless it was settled, and releasing it closes the
step in storage too. The handler runs in a task of its own so that a cancel stops the
step without ever interrupting the bookkeeping around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from starlette.responses import Response

from model_gateway.gateway.agents.transcript import step_transcript
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.pipeline.context import Billing, RequestContext
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import (
    GatewayError,
    InternalError,
)
from model_gateway.pipeline.hold import Hold
from model_gateway.pipeline.policy import admit_model
from model_gateway.pipeline.ports import Meter
from model_gateway.pipeline.request_id import new_request_id
from model_gateway.pipeline.reservation import new_receipt_id
from model_gateway.pipeline.settle import settlement_of
from model_gateway.storage import (
    LimitReached,
    ProjectRecord,
    StateConflict,
    Storage,
    StorageError,
)
from model_gateway.storage.base import RunRecord, StepRecord, now_s

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from model_gateway.pipeline.ports import ProjectInfo

log = logging.getLogger("gateway.agents")


class RunStops(Exception):
    """The run cannot go on: it ends with `status` and the error object `error`."""

    def __init__(self, status: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.status = status
        self.error = error


def error_object(error: GatewayError, request_id: str | None = None) -> dict[str, Any]:
    return error.body(request_id)["error"]


def budget_exceeded() -> RunStops:
    message = "The run's remaining budget cannot cover the next step."
    return RunStops("budget_exceeded", {"type": "budget_exceeded", "message": message})


def cancelled() -> RunStops:
    return RunStops("cancelled", {"type": "cancelled", "message": "The run was cancelled."})


def check_model(
    catalog: ConfigCatalog, model_id: str, project: ProjectInfo, *, uses_tools: bool
) -> None:
    """The policy stage's model checks, for a caller with no key (GatewayError)."""
    admit_model(catalog, model_id, None, project, uses_tools=uses_tools, mode="chat")


@dataclass(slots=True)
class StepControl:
    """Shared by a run's loop and whoever stops it: the handler task of the step in flight."""

    handler: asyncio.Future[ASGIApp] | None = None
    stop: RunStops | None = None  # why the run must stop at its next chance
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # wakes a waiting run

    def interrupt(self, reason: RunStops) -> None:
        if self.stop is None:
            self.stop = reason
        self.stopped.set()
        if self.handler is not None:
            self.handler.cancel()


class StepRunner:
    def __init__(
        self,
        storage: Storage,
        meter: Meter,
        catalog: ConfigCatalog,
        *,
        model_endpoint: Endpoint,
        sandbox_endpoint: Endpoint,
    ) -> None:
        self.storage = storage
        self.meter = meter
        self.catalog = catalog
        self.endpoints = {"model": model_endpoint, "sandbox": sandbox_endpoint}

    async def run(
        self,
        kind: str,
        run: RunRecord,
        project: ProjectRecord,
        seq: int,
        request: dict[str, Any],
        control: StepControl,
    ) -> dict[str, Any]:
        """Run one step; the endpoint's JSON answer. RunStops when the run cannot go on
        (nothing is left held either way)."""
        endpoint = self.endpoints[kind]
        ctx = RequestContext(new_request_id(), endpoint=endpoint, project=project)
        ctx.body = orjson.dumps(request)
        try:
            amount = await self._admit(ctx, kind)
        except GatewayError as error:  # nothing reserved, nothing recorded
            raise RunStops("failed", error_object(error, ctx.request_id)) from None
        assert endpoint.pricing is not None
        step = StepRecord(
            run_id=run.id,
            seq=seq,
            kind=kind,
            subject=endpoint.pricing.subject(ctx),
            hold=amount,
            created_at=now_s(),
        )
        await self._begin(step)
        try:
            hold = await Hold.take(self.meter, project.id, None, amount)
        except GatewayError as error:  # the project's balance or monthly budget
            with anyio.CancelScope(shield=True):
                await self.storage.drop_step(run.id, seq)
            status = "budget_exceeded" if error.type == "budget_exceeded" else "failed"
            raise RunStops(status, error_object(error, ctx.request_id)) from None
        ctx.hold, ctx.receipt_id = hold, new_receipt_id()
        return await self._execute(ctx, request, step, hold, control)

    async def _admit(self, ctx: RequestContext, kind: str) -> int:
        """Decode, admit and price the request as the pipeline would; its hold."""
        endpoint = ctx.endpoint
        assert endpoint is not None and endpoint.decode is not None
        assert endpoint.pricing is not None and ctx.project is not None
        ctx.payload = endpoint.decode(ctx.body)
        if kind == "model":
            model_id = ctx.payload.model
            ctx.model_id, ctx.model = admit_model(
                self.catalog, model_id, None, ctx.project, uses_tools=ctx.payload.uses_tools
            )
        if endpoint.admit is not None:
            await endpoint.admit(ctx)
        return endpoint.pricing.estimate(ctx)

    async def _begin(self, step: StepRecord) -> None:
        try:
            await self.storage.begin_step(step)
        except LimitReached:
            raise budget_exceeded() from None
        except StateConflict as conflict:
            # The trigger's reason ends the message ("SQLite begin_step: run_cancelled").
            if str(conflict).endswith("run_cancelled"):
                raise cancelled() from None
            # run_not_running: ended elsewhere (a sweeper judged this process dead); the
            # run keeps that end, finishing it again changes nothing.
            raise RunStops("failed", {"type": "internal_error", "message": str(conflict)}) from None

    async def _execute(
        self,
        ctx: RequestContext,
        request: dict[str, Any],
        step: StepRecord,
        hold: Hold,
        control: StepControl,
    ) -> dict[str, Any]:
        kind = step.kind
        started = time.monotonic()
        failure: RunStops | None = None
        answer: dict[str, Any] = {}
        try:
            await self.storage.attach_step_hold(step.run_id, step.seq, hold.reservation.id)
            assert ctx.endpoint is not None
            handler = control.handler = asyncio.ensure_future(ctx.endpoint.handler(ctx))
            try:
                await asyncio.wait({handler})
            finally:
                control.handler = None
                handler.cancel()  # a no-op once done; stops it if this task was cancelled
            answer, failure = self._outcome(ctx, kind, handler, started, control)
            settlement = settlement_of(ctx)
            if settlement is not None:
                await hold.settle(settlement)
        except StorageError:  # recording or settling failed: the hold is released below
            log.exception("run %s: step %d could not be recorded or settled", step.run_id, step.seq)
            failure = RunStops("failed", error_object(InternalError(), ctx.request_id))
        finally:
            await hold.release()  # a no-op once settled
            transcript = step_transcript(kind, request, answer)
            with anyio.CancelScope(shield=True):
                await self._describe(ctx, step, started, failure, transcript)
        if failure is not None:
            raise failure
        return answer

    def _outcome(
        self,
        ctx: RequestContext,
        kind: str,
        handler: asyncio.Future[ASGIApp],
        started: float,
        control: StepControl,
    ) -> tuple[dict[str, Any], RunStops | None]:
        """The endpoint's answer, or why the run stops; sets ctx.billing for what ran."""
        if handler.cancelled():
            if kind == "sandbox":  # the program ran until now: billed for that time
                duration_ms = int((time.monotonic() - started) * 1000)
                ctx.billing = Billing("cancelled", {"duration_ms": duration_ms})
            return {}, control.stop or cancelled()
        error = handler.exception()
        if error is not None:
            if not isinstance(error, GatewayError):
                log.error("run %s step %s failed", ctx.request_id, kind, exc_info=error)
                error = InternalError()
            return {}, RunStops("failed", error_object(error, ctx.request_id))
        response = handler.result()
        assert isinstance(response, Response)  # the /v1 handlers' whole JSON answers
        return orjson.loads(response.body), None

    async def _describe(
        self,
        ctx: RequestContext,
        step: StepRecord,
        started: float,
        failure: RunStops | None,
        transcript: dict[str, Any],
    ) -> None:
        usage = ctx.billing.usage if ctx.billing is not None else {}
        if step.kind == "sandbox":
            duration_ms = usage.get("duration_ms", 0)
        else:
            duration_ms = int((time.monotonic() - started) * 1000)
        await self.storage.describe_step(
            step.run_id,
            step.seq,
            input_tokens=usage.get("input_tokens", 0),
            output_tokens=usage.get("output_tokens", 0),
            duration_ms=duration_ms,
            error=None if failure is None else failure.error,
            transcript=transcript,
        )
