"""OpenAI request shapes for Chat Completions and Responses, validated at decode time.

Declared generation parameters pass through to the provider; undeclared fields are
dropped. Cross-field rules that need a `param` path (image inputs) live in `check()`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from gateway.errors import InvalidRequest
from gateway.validation import param_path

NonEmpty = Annotated[str, Meta(min_length=1)]
PositiveInt = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
Probability = Annotated[float, Meta(ge=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]

IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})


class _ContentPart(msgspec.Struct, kw_only=True):
    """What the gateway itself reads of a content part (the rest passes through as sent)."""

    type: str
    text: str | UnsetType = UNSET
    refusal: str | UnsetType = UNSET


class _InputMessage(msgspec.Struct, kw_only=True):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"] = "user"
    content: str | list[_ContentPart]


class _FunctionCall(msgspec.Struct, kw_only=True):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class _FunctionCallOutput(msgspec.Struct, kw_only=True):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[_ContentPart]


# Responses input items are free-form JSON; the forms the gateway translates are checked
# against these shapes, so a wrong type is a 400 with its path, never a 500 later.
_INPUT_ITEM_SHAPES = {
    "message": _InputMessage,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
}


def _check_shape(value: Any, shape: type, where: str) -> None:
    try:
        msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        inner = param_path(str(exc))
        param = f"{where}.{inner}" if inner else where
        raise InvalidRequest(f"Invalid value at {param}.", param=param) from None


def _check_parts(parts: list[Any], where: str) -> None:
    for j, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
            raise InvalidRequest("Image inputs are not supported.", param=f"{where}.{j}")
        _check_shape(part, _ContentPart, f"{where}.{j}")


class _Request(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: NonEmpty
    stream: bool = False
    tools: list[dict[str, Any]] | UnsetType = UNSET
    tool_choice: str | dict[str, Any] | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    top_p: Probability | UnsetType = UNSET
    user: str | UnsetType = UNSET
    metadata: dict[str, str] | UnsetType = UNSET
    store: bool | UnsetType = UNSET

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or self.tool_choice not in (UNSET, "none")


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | UnsetType | None = UNSET
    name: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    refusal: str | UnsetType | None = UNSET


class ChatRequest(_Request):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream_options: dict[str, Any] | UnsetType = UNSET
    max_tokens: PositiveInt | UnsetType = UNSET
    max_completion_tokens: PositiveInt | UnsetType = UNSET
    n: Annotated[int, Meta(ge=1, le=1)] | UnsetType = UNSET
    stop: str | list[str] | UnsetType | None = UNSET
    presence_penalty: Penalty | UnsetType = UNSET
    frequency_penalty: Penalty | UnsetType = UNSET
    logit_bias: dict[str, float] | UnsetType = UNSET
    logprobs: bool | UnsetType = UNSET
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    response_format: dict[str, Any] | UnsetType = UNSET
    reasoning_effort: str | UnsetType = UNSET

    def check(self) -> None:
        for i, message in enumerate(self.messages):
            content = message.content
            if content is UNSET and not (message.role == "assistant" and message.tool_calls):
                raise InvalidRequest(
                    "Every message needs a content.", param=f"messages.{i}.content"
                )
            if isinstance(content, list):
                _check_parts(content, f"messages.{i}.content")

    @property
    def output_limit(self) -> int | None:
        for limit in (self.max_completion_tokens, self.max_tokens):
            if limit is not UNSET:
                return limit
        return None


class ResponsesRequest(_Request):
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    instructions: str | UnsetType | None = UNSET
    max_output_tokens: PositiveInt | UnsetType = UNSET
    text: dict[str, Any] | UnsetType = UNSET
    reasoning: dict[str, Any] | UnsetType = UNSET
    truncation: str | UnsetType = UNSET

    def check(self) -> None:
        if isinstance(self.input, str):
            return
        for i, item in enumerate(self.input):
            kind = item.get("type") or "message"
            if not isinstance(kind, str):
                raise InvalidRequest("An item type must be a string.", param=f"input.{i}.type")
            if kind in IMAGE_PART_TYPES:
                raise InvalidRequest("Image inputs are not supported.", param=f"input.{i}")
            content = item.get("content")
            if isinstance(content, list):
                _check_parts(content, f"input.{i}.content")
            shape = _INPUT_ITEM_SHAPES.get(kind)
            if shape is not None:
                _check_shape(item, shape, f"input.{i}")

    @property
    def output_limit(self) -> int | None:
        return None if self.max_output_tokens is UNSET else self.max_output_tokens
