"""Chat completion chunks in, OpenAI Responses stream events out.

The events follow OpenAI's order: response.created and response.in_progress; per output
item output_item.added, its deltas, its .done events and output_item.done (one item open
at a time); then response.completed (or response.incomplete). Every event carries a
`sequence_number` counted from 0.
"""

from __future__ import annotations

import time
from typing import Any

from model_gateway.gateway.inference.json_types import JSONObject
from model_gateway.gateway.inference.responses_translate import (
    PART_TEXT,
    ending,
    function_call_item,
    message_item,
    new_id,
    response_object,
    response_usage,
)
from model_gateway.gateway.inference.tokens import content_text, text_of


def _logprobs(kind: str) -> JSONObject:
    return {"logprobs": []} if kind == "output_text" else {}  # only text carries them


Event = tuple[str, JSONObject]


class ResponsesEvents:
    def __init__(self, request: JSONObject) -> None:
        self.request = request  # the client's Responses request
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.sequence = 0
        self.output: list[JSONObject] = []
        self.current: JSONObject | None = None  # the open output item
        # chat tool call index (None when the upstream sent null) -> its output item
        self.calls: dict[int | None, JSONObject] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None  # chat usage, as the upstream reported it (when it did)

    def _event(self, name: str, /, **fields: Any) -> Event:
        payload = {"type": name, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return name, payload

    def _response(self, status: str, incomplete: JSONObject | None = None) -> JSONObject:
        return response_object(
            self.request,
            response_id=self.id,
            created_at=self.created_at,
            status=status,
            output=self.output,
            usage=response_usage(self.usage) if status != "in_progress" else None,
            incomplete=incomplete,
        )

    def start(self) -> list[Event]:
        snapshot = self._response("in_progress")
        snapshot["output"] = []
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: JSONObject) -> list[Event]:
        events: list[Event] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = content_text(delta.get("content"))  # a string, or parts
            if text:
                events += self._text(text)
            refusal = text_of(delta.get("refusal"))
            if refusal:
                events += self._text(refusal, "refusal")
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[Event]:
        status, incomplete = ending(self.finish_reason)
        events = self._close(status)
        name = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(name, response=self._response(status, incomplete))]

    def _open(self, item: JSONObject) -> list[Event]:
        self.output.append(item)
        self.current = item
        added = {**item, "status": "in_progress"}
        if item["type"] == "message":
            added["content"] = []
        return [
            self._event("response.output_item.added", output_index=len(self.output) - 1, item=added)
        ]

    def _text(self, text: str, kind: str = "output_text") -> list[Event]:
        """Text of a message part of `kind` (output_text, or refusal), in the current
        message if its part is of that kind, else in a new one."""
        field = PART_TEXT[kind]
        events: list[Event] = []
        item = self.current
        if item is None or item["type"] != "message" or item["content"][0]["type"] != kind:
            events += self._close("completed")
            item = message_item(new_id("msg"), "", "in_progress", kind)
            events += self._open(item)
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=len(self.output) - 1,
                    content_index=0,
                    part=dict(item["content"][0]),
                )
            )
        item["content"][0][field] += text
        events.append(
            self._event(
                f"response.{kind}.delta",
                item_id=item["id"],
                output_index=self.output.index(item),
                content_index=0,
                delta=text,
                **_logprobs(kind),
            )
        )
        return events

    def _call(self, call: JSONObject) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        index = call.get("index", 0)
        item = self.calls.get(index)
        if item is None:
            events += self._close("completed")
            item = function_call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                function.get("name") or "",
                "",
                "in_progress",
            )
            self.calls[index] = item
            events += self._open(item)
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            if item is self.current:
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.output.index(item),
                        delta=arguments,
                    )
                )
        return events

    def _close(self, status: str) -> list[Event]:
        item, self.current = self.current, None
        if item is None:
            return []
        index = self.output.index(item)
        item["status"] = status
        events: list[Event] = []
        if item["type"] == "message":
            part = item["content"][0]
            kind, field = part["type"], PART_TEXT[part["type"]]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                self._event(
                    f"response.{kind}.done", **common, **{field: part[field]}, **_logprobs(kind)
                )
            )
            events.append(self._event("response.content_part.done", **common, part=part))
        else:
            item["status"] = "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events
