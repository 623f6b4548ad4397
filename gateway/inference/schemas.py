"""OpenAI request shapes for Chat Completions and Responses, validated at decode time.

Declared generation parameters pass through to the provider; undeclared fields are
dropped. Cross-field rules that need a `param` path (image inputs) live in `check()`, and
so do the shapes of the free-form fields the gateway reads (tools, tool calls, `text`):
a wrong type anywhere the gateway looks is a 400 with its path, never a 500 later.
Only `function` tools pass: any other tool runs upstream at a cost no price covers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.pipeline.validation import param_path

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


class _ChatFunction(msgspec.Struct, kw_only=True):
    name: NonEmpty
    description: str | UnsetType | None = UNSET
    parameters: dict[str, Any] | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class _ChatTool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: _ChatFunction


class _ResponsesTool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: str | UnsetType = UNSET
    description: str | UnsetType | None = UNSET
    parameters: dict[str, Any] | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class _CalledFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct, kw_only=True):
    id: str | UnsetType = UNSET
    type: Literal["function"] = "function"
    function: _CalledFunction


class _ChatNamedFunction(msgspec.Struct, kw_only=True):
    name: str


class _ChatToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: _ChatNamedFunction


class _ResponsesToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function", "auto", "none", "required"]
    name: str | UnsetType = UNSET


class _TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | UnsetType = UNSET
    schema: dict[str, Any] | UnsetType = UNSET
    strict: bool | UnsetType | None = UNSET
    description: str | UnsetType = UNSET


class _Text(msgspec.Struct, kw_only=True):
    format: _TextFormat | UnsetType = UNSET
    verbosity: str | UnsetType | None = UNSET


class _Reasoning(msgspec.Struct, kw_only=True):
    effort: str | UnsetType | None = UNSET
    summary: str | UnsetType | None = UNSET


TOOL_CHOICES = frozenset({"none", "auto", "required"})

# Responses input items are free-form JSON; the forms the gateway translates are checked
# against these shapes, so a wrong type is a 400 with its path, never a 500 later.
_INPUT_ITEM_SHAPES = {
    "message": _InputMessage,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
}


def check_shape(value: Any, shape: type, where: str) -> None:
    try:
        msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        inner = param_path(str(exc))
        param = f"{where}.{inner}" if inner else where
        raise InvalidRequest(f"Invalid value at {param}.", param=param) from None


def _check_parts(parts: list[Any], where: str) -> None:
    for j, part in enumerate(parts):
        check_shape(part, _ContentPart, f"{where}.{j}")  # first: `type` is a string after
        if part["type"] in IMAGE_PART_TYPES:
            raise InvalidRequest("Image inputs are not supported.", param=f"{where}.{j}")


def _check_tools(tools: list[dict[str, Any]], shape: type) -> None:
    for k, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise InvalidRequest(
                "Only function tools are accepted: other tools have an upstream cost "
                "that no price on this deployment covers.",
                param=f"tools.{k}.type",
            )
        check_shape(tool, shape, f"tools.{k}")


def _check_tool_choice(choice: str | dict[str, Any], shape: type) -> None:
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise InvalidRequest(
                "tool_choice must be none, auto, required or a function.", param="tool_choice"
            )
        return
    if choice.get("type") not in ("function", "auto", "none", "required"):
        raise InvalidRequest("Only function tools can be chosen.", param="tool_choice.type")
    check_shape(choice, shape, "tool_choice")


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

    def _check_tool_fields(self, tool: type, choice: type) -> None:
        if self.tools is not UNSET:
            _check_tools(self.tools, tool)
        if self.tool_choice is not UNSET:
            _check_tool_choice(self.tool_choice, choice)


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
        self._check_tool_fields(_ChatTool, _ChatToolChoice)
        for i, message in enumerate(self.messages):
            content = message.content
            if content is UNSET and not (message.role == "assistant" and message.tool_calls):
                raise InvalidRequest(
                    "Every message needs a content.", param=f"messages.{i}.content"
                )
            if isinstance(content, list):
                _check_parts(content, f"messages.{i}.content")
            for k, call in enumerate(message.tool_calls or ()):
                check_shape(call, _ToolCall, f"messages.{i}.tool_calls.{k}")

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
        self._check_tool_fields(_ResponsesTool, _ResponsesToolChoice)
        if self.text is not UNSET:
            check_shape(self.text, _Text, "text")
        if self.reasoning is not UNSET:
            check_shape(self.reasoning, _Reasoning, "reasoning")
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
                check_shape(item, shape, f"input.{i}")

    @property
    def output_limit(self) -> int | None:
        return None if self.max_output_tokens is UNSET else self.max_output_tokens
