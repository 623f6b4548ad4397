"""Writes `openai-schemas.json`: the schemas of OpenAI's published OpenAPI document
(github.com/openai/openai-openapi, MIT license) that the gateway's responses must match,
with everything they reference, descriptions dropped.

    python tests/support/openapi/extract.py PATH/TO/openapi.json COMMIT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOTS = [
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "Response",
    "ResponseStreamEvent",
    "Model",
    "ListModelsResponse",
]
DROP = {"description", "example", "examples", "x-oaiMeta", "x-oaiExpandable", "title"}


def refs(node, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            refs(value, found)
    elif isinstance(node, list):
        for value in node:
            refs(value, found)


def strip(node):
    """Drop documentation keywords of a schema, never a property that has such a name."""
    if isinstance(node, list):
        return [strip(v) for v in node]
    if not isinstance(node, dict):
        return node
    kept = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "$defs"):
            kept[key] = {name: strip(schema) for name, schema in value.items()}
        elif key not in DROP and key != "nullable":
            kept[key] = strip(value)
    if node.get("nullable") is True:
        # OpenAPI 3.0's `nullable`, still used in this 3.1 document: JSON Schema says it so.
        return {"anyOf": [kept, {"type": "null"}]}
    return kept


def main(source: str, commit: str) -> None:
    schemas = json.loads(Path(source).read_text())["components"]["schemas"]
    keep: set[str] = set()
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name in keep:
            continue
        keep.add(name)
        found: set[str] = set()
        refs(schemas[name], found)
        pending.extend(found - keep)
    document = {
        "source": f"https://github.com/openai/openai-openapi/blob/{commit}/openapi.json",
        "license": "MIT, Copyright (c) OpenAI",
        "components": {"schemas": {name: strip(schemas[name]) for name in sorted(keep)}},
    }
    out = Path(__file__).with_name("openai-schemas.json")
    out.write_text(json.dumps(document, separators=(",", ":"), sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
