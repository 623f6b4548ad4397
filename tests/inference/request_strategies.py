"""Hypothesis strategies for inference request bodies: well-formed Chat Completions and
Responses requests with the nested fields the gateway reads (tools and their schemas,
tool calls, content parts, input items, `text.format`, `tool_choice`), and the same
bodies with a wrong type put somewhere inside them, at any depth.

Used by tests/e2e/test_fuzz.py (against the real server) and by the in-process property
tests of the request translations.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)

name = st.text(min_size=1, max_size=8)
short = st.text(max_size=12)
json_schema = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "boolean"])}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(name, inner, max_size=2)}
    ),
    max_leaves=4,
)


def _parts(kinds: list[str]):
    part = st.fixed_dictionaries({"type": st.sampled_from(kinds), "text": short})
    return st.lists(part, min_size=1, max_size=2)


_function = st.fixed_dictionaries(
    {"name": name},
    optional={"description": short, "parameters": json_schema, "strict": st.booleans()},
)
chat_tool = st.fixed_dictionaries({"type": st.just("function"), "function": _function})
tool_call = st.fixed_dictionaries(
    {
        "id": name,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": name, "arguments": st.just('{"x": 1}')}),
    }
)
chat_message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user"]),
            "content": st.one_of(short, _parts(["text"])),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(st.none(), short),
            "tool_calls": st.lists(tool_call, min_size=1, max_size=2),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": name, "content": short}),
)
chat_body = st.fixed_dictionaries(
    {"model": st.just("echo-1"), "messages": st.lists(chat_message, min_size=1, max_size=3)},
    optional={
        "tools": st.lists(chat_tool, min_size=1, max_size=2),
        "tool_choice": st.one_of(
            st.sampled_from(["auto", "none", "required"]),
            st.fixed_dictionaries(
                {"type": st.just("function"), "function": st.fixed_dictionaries({"name": name})}
            ),
        ),
        "parallel_tool_calls": st.booleans(),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "response_format": st.fixed_dictionaries({"type": st.just("json_object")}),
        "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
        "max_tokens": st.integers(1, 50),
        "temperature": st.floats(0, 2),
        "metadata": st.dictionaries(name, short, max_size=2),
        "user": short,
    },
)

responses_item = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer"]),
            "content": st.one_of(short, _parts(["input_text", "output_text"])),
        },
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": name,
            "name": name,
            "arguments": st.just("{}"),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": name, "output": short}
    ),
)
responses_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "name": name},
    optional={"description": short, "parameters": json_schema, "strict": st.booleans()},
)
text_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "name": name, "schema": json_schema}),
)
responses_body = st.fixed_dictionaries(
    {
        "model": st.just("echo-1"),
        "input": st.one_of(short, st.lists(responses_item, min_size=1, max_size=3)),
    },
    optional={
        "instructions": short,
        "tools": st.lists(responses_tool, min_size=1, max_size=2),
        "tool_choice": st.one_of(
            st.sampled_from(["auto", "none", "required"]),
            st.fixed_dictionaries({"type": st.just("function"), "name": name}),
        ),
        "text": st.fixed_dictionaries({"format": text_format}),
        "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "high"])}),
        "stream": st.booleans(),
        "max_output_tokens": st.integers(1, 50),
        "metadata": st.dictionaries(name, short, max_size=2),
    },
)


def slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) of a JSON value, at every depth."""
    found: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            members = list(node.items())
        elif isinstance(node, list):
            members = list(enumerate(node))
        else:
            continue
        for key, child in members:
            found.append((node, key))
            stack.append(child)
    return found


@st.composite
def with_wrong_types(draw, bodies, changes: int = 2) -> dict:
    """A body from `bodies` with one or more values, anywhere inside, replaced by any JSON
    value (most often of another type than the one expected there)."""
    body = draw(bodies)
    for _ in range(draw(st.integers(1, changes))):
        container, key = draw(st.sampled_from(slots(body)))
        container[key] = draw(json_any)
    return body
