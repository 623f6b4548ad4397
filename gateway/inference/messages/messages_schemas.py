"""Anthropic Messages request shapes (POST /v1/messages, /v1/messages/count_tokens),
validated at decode time.

What the gateway reads is declared and checked, a wrong type anywhere it looks a 400 with
its `param` path in the request's own terms (`messages.0.content.1.tool_use_id`): the
model, max_tokens (required), the messages and their text, tool_use and tool_result
blocks, the system prompt, tools and tool_choice, and the sampling fields it translates.
Everything else (`cache_control`, `thinking`, `container`, block types it does not know)
is never refused: an Anthropic upstream gets the body as it came, a translation drops it.
Image and document blocks are refused (decisions.md, "Inbound APIs beyond OpenAI's"), and
so are tools that are not the client's own (`type` other than "custom"): their upstream
cost is not priced, as for the Responses API.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from model_gateway.gateway.inference.schemas import NonEmpty, PositiveInt, Probability, check_shape
from model_gateway.pipeline.errors import InvalidRequest

# Block types that carry a file's content: not accepted (as image inputs elsewhere).
FILE_BLOCK_TYPES = frozenset({"image", "document"})


class _Block(msgspec.Struct, kw_only=True):
    type: str


class _TextBlock(msgspec.Struct, kw_only=True):
    type: Literal["text"]
    text: str


class _ToolUseBlock(msgspec.Struct, kw_only=True):
    type: Literal["tool_use"]
    id: str
    name: NonEmpty
    input: dict[str, Any]


class _ToolResultBlock(msgspec.Struct, kw_only=True):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | UnsetType = UNSET
    is_error: bool | UnsetType = UNSET


_BLOCK_SHAPES: dict[str, type] = {
    "text": _TextBlock,
    "tool_use": _ToolUseBlock,
    "tool_result": _ToolResultBlock,
}


class _Tool(msgspec.Struct, kw_only=True):
    type: Literal["custom"] | UnsetType | None = UNSET
    name: NonEmpty
    description: str | UnsetType = UNSET
    input_schema: dict[str, Any]


class _ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: NonEmpty | UnsetType = UNSET
    disable_parallel_tool_use: bool | UnsetType = UNSET


class _Metadata(msgspec.Struct, kw_only=True):
    user_id: str | UnsetType | None = UNSET


def _check_blocks(blocks: list[Any], where: str) -> None:
    for j, block in enumerate(blocks):
        here = f"{where}.{j}"
        check_shape(block, _Block, here)  # first: `type` is a string after
        kind = block["type"]
        if kind in FILE_BLOCK_TYPES:
            raise InvalidRequest("Image and document inputs are not supported.", param=here)
        shape = _BLOCK_SHAPES.get(kind)
        if shape is not None:
            check_shape(block, shape, here)
        if kind == "tool_result" and isinstance(block.get("content"), list):
            _check_blocks(block["content"], f"{here}.content")


class _Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """What both endpoints read: the prompt (count_tokens takes no output limit)."""

    model: NonEmpty
    messages: Annotated[list[_Message], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET
    tool_choice: dict[str, Any] | UnsetType = UNSET

    @property
    def uses_tools(self) -> bool:
        choice = self.tool_choice
        return bool(self.tools) or (choice is not UNSET and choice.get("type") != "none")

    @property
    def output_limit(self) -> int | None:
        return None

    def check(self) -> None:
        if isinstance(self.system, list):
            _check_blocks(self.system, "system")
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list):
                _check_blocks(message.content, f"messages.{i}.content")
        for k, tool in enumerate(self.tools or ()):
            if tool.get("type", "custom") not in ("custom", None):
                raise InvalidRequest(
                    "Only custom tools are accepted: other tools have an upstream cost "
                    "that no price on this deployment covers.",
                    param=f"tools.{k}.type",
                )
            check_shape(tool, _Tool, f"tools.{k}")
        if self.tool_choice is not UNSET:
            check_shape(self.tool_choice, _ToolChoice, "tool_choice")
            if self.tool_choice["type"] == "tool" and "name" not in self.tool_choice:
                raise InvalidRequest("A tool choice of type tool names it.", param="tool_choice")


class MessagesRequest(CountTokensRequest):
    max_tokens: PositiveInt
    stream: bool = False
    stop_sequences: list[str] | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0, le=1)] | UnsetType = UNSET
    top_p: Probability | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    metadata: dict[str, Any] | UnsetType = UNSET

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        super().check()
        if self.metadata is not UNSET:
            check_shape(self.metadata, _Metadata, "metadata")
