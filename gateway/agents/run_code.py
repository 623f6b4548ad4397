"""The agents' one tool, `run_code`: its definition for the model, its arguments, and a
program's result as the tool message the model reads next."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from model_gateway.gateway.sandbox.runtimes import RUNTIMES, Runtime

RUN_CODE = "run_code"

DEFINITION = {
    "type": "function",
    "function": {
        "name": RUN_CODE,
        "description": "Run a program in the agent's sandbox (no network) and read its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "runtime": {"type": "string", "enum": list(RUNTIMES)},
                "code": {"type": "string", "description": "The whole program."},
            },
            "required": ["runtime", "code"],
            "additionalProperties": False,
        },
    },
}


class RunCode(msgspec.Struct, forbid_unknown_fields=True):
    runtime: Runtime
    code: Annotated[str, msgspec.Meta(min_length=1)]


_decode = msgspec.json.Decoder(RunCode).decode


class BadToolCall(Exception):
    """The model called a tool that does not exist or with arguments that do not fit."""


def parse_call(call: dict[str, Any]) -> RunCode:
    function = call.get("function") or {}
    if function.get("name") != RUN_CODE:
        raise BadToolCall(f"The model called an unknown tool {function.get('name')!r}.")
    try:
        return _decode(function.get("arguments") or "")
    except msgspec.DecodeError as exc:  # ValidationError included
        raise BadToolCall(f"The model's run_code arguments are invalid: {exc}.") from None


def tool_result(execution: dict[str, Any]) -> str:
    """What the model reads: the program's stdout as it is (so a model can quote it), and
    only when something went wrong, its status, exit code and stderr."""
    text: str = execution.get("stdout", "")
    if execution.get("stdout_truncated"):
        text += "\n[stdout truncated]"
    if execution.get("status") != "completed" or execution.get("exit_code"):
        text += f"\n[status: {execution.get('status')}, exit code {execution.get('exit_code')}]"
    if execution.get("stderr"):
        text += "\n[stderr]\n" + execution["stderr"]
    return text
