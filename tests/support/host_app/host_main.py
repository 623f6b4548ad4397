"""A host application, run from its own folder (so its `storage` and `pipeline` modules come
first on sys.path): `embedded` mounts the whole gateway; `custom` builds a chain from the
stages around the host's own endpoint, with the in-memory ports and no `gateway` import."""

from __future__ import annotations

import os

import msgspec
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route

import pipeline  # the host's own modules, imported before the gateway's packages
import storage
from model_gateway.pipeline import build_pipeline
from model_gateway.pipeline.context import Billing, RequestContext
from model_gateway.pipeline.endpoint import Endpoint, RouteTable
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.memory import (
    Key,
    MemoryKeys,
    MemoryMeter,
    Model,
    Project,
    StaticCatalog,
)
from model_gateway.pipeline.validation import decoder

assert storage.HOST_MARKER and pipeline.HOST_MARKER


async def home(request):
    return PlainTextResponse("the host app")


def embedded_app() -> Starlette:
    from model_gateway.gateway.app import create_app
    from model_gateway.gateway.config import load_config

    gateway = create_app(load_config(os.environ["GATEWAY_CONFIG"]))
    return Starlette(
        routes=[Route("/", home), Mount("/llm", app=gateway)], lifespan=gateway.lifespan
    )


# The custom chain: one metered endpoint of the host's own.
HOST_KEY = "host-secret-key"
PROJECTS = {"prj_host": Project("prj_host", balance=1500, allow_models=["tiny"])}
KEYS = {HOST_KEY: Key("key_host", "prj_host", frozenset({"inference"}), rpm=1000)}
METER = MemoryMeter(PROJECTS, KEYS)


class Question(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    question: str

    @property
    def uses_tools(self) -> bool:
        return False


class FlatPricing:
    kind = "inference"

    def subject(self, ctx: RequestContext) -> str:
        return ctx.model_id or ""

    def estimate(self, ctx: RequestContext) -> int:
        return 1000  # micro-units held before the handler runs

    def cost(self, ctx: RequestContext) -> int:
        return 600


async def answer(ctx: RequestContext):
    ctx.billing = Billing("succeeded", {"input_tokens": 1, "output_tokens": 1})
    return JSONResponse({"answer": ctx.payload.question.upper(), "receipt": ctx.receipt_id})


async def books(request):
    project = PROJECTS["prj_host"]
    receipts = [s.receipt_id for s in METER.receipts]
    return JSONResponse(
        {"balance": project.balance, "reserved": METER.reserved("prj_host"), "receipts": receipts}
    )


chain = build_pipeline(
    routes=RouteTable(
        [
            Endpoint(
                "POST",
                "/v1/answer",
                "inference",
                answer,
                decode=decoder(Question),
                pricing=FlatPricing(),
            )
        ]
    ),
    keys=MemoryKeys(PROJECTS, KEYS),
    catalog=StaticCatalog({"tiny": Model()}),
    limiter=Gcra(),
    meter=METER,
    cors_origins=[],
    default_key_rpm=600,
    default_project_rpm=600,
)
custom = Starlette(routes=[Route("/books", books), Mount("/", app=chain)])
