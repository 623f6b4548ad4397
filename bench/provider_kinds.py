"""What each provider kind's adapter costs the gateway, against the OpenAI pass-through.

One gateway in front of every kind's fake upstream (the test suite's fakes, which check
keys, signatures and tokens as the vendors do, in threads of this process); the same
wrk load on a model of each kind in turn, rounds alternating the kinds, and the
gateway's own CPU seconds per request (its process only: the fakes and wrk do not
count). Printed per inbound API as microseconds per request and as the ratio to the
`openai` kind on the same API, so a slow translation shows.

    python bench/provider_kinds.py [--rounds 3] [--seconds 3] [--connections 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from load import BENCH_DIR, run_wrk
from procs import cpu_seconds

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_azure import FakeAzure
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini, FakeVertex
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess

PROMPT = "Benchmark the translation of this request, please."
APIS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
    "chat stream": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPT}], "stream": True},
    ),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}]}),
    "messages stream": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": PROMPT}], "stream": True},
    ),
}
ANTHROPIC_KEY = "bench-anthropic-key"


def _anthropic_block(fake: FakeAnthropic) -> tuple[str, dict[str, str]]:
    block = f"""
[providers.anthropic]
kind = "anthropic"
base_url = "{fake.url}"
api_key_env = "BENCH_ANTHROPIC_KEY"
"""
    return block, {"BENCH_ANTHROPIC_KEY": ANTHROPIC_KEY}


def _model(kind: str) -> str:
    return f"""
[models."{kind}/normal"]
provider = "{kind}"
upstream = "normal"
input_price_per_mtok = "1"
output_price_per_mtok = "2"
max_output_tokens = 64
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--api", choices=APIS, action="append")
    args = parser.parse_args()
    apis = args.api or list(APIS)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        fakes = {
            "openai": stack.enter_context(FakeOpenAI("bench-openai-key")),
            "azure": stack.enter_context(FakeAzure()),
            "anthropic": stack.enter_context(FakeAnthropic(ANTHROPIC_KEY)),
            "gemini": stack.enter_context(FakeGemini()),
            "vertex": stack.enter_context(FakeVertex()),
            "bedrock": stack.enter_context(FakeBedrock()),
        }
        config, env = "", {}
        for kind, fake in fakes.items():
            block, variables = (
                _anthropic_block(fake) if kind == "anthropic" else fake.provider_config(kind)
            )
            config += block + _model(kind)
            env |= variables
        gateway = GatewayProcess(Path(folder), extra_config=config, env=env).start()
        stack.callback(gateway.stop)
        project = gateway.cli("projects", "create", "bench", "--balance", "1000000")["id"]
        key = gateway.create_key(project, "inference", "--rpm", "10000000")
        pid = gateway.process.pid
        cpu: dict[tuple[str, str], list[float]] = {}
        with open(Path(folder) / "wrk.raw", "w") as raw:
            for _ in range(args.rounds):
                for api in apis:
                    path, body = APIS[api]
                    for kind in fakes:
                        data = {**body, "model": f"{kind}/normal", "max_tokens": 64}
                        body_file = Path(folder) / "body.json"
                        body_file.write_text(json.dumps(data))
                        before = cpu_seconds(pid)
                        result = run_wrk(
                            gateway.url + path,
                            args.connections,
                            args.seconds,
                            str(BENCH_DIR / "post.lua"),
                            [key, str(body_file)],
                            raw,
                        )
                        if result.errors or result.bad_status or not result.requests:
                            sys.exit(f"{kind} {api}: {result.bad_status} bad answers")
                        spent = cpu_seconds(pid) - before
                        cpu.setdefault((api, kind), []).append(spent / result.requests)
    print("| API | kind | gateway CPU µs / request (median) | ratio to openai |")
    print("|---|---|---:|---:|")
    for api in apis:
        base = statistics.median(cpu[(api, "openai")])
        for kind in fakes:
            median = statistics.median(cpu[(api, kind)])
            print(f"| {api} | {kind} | {median * 1e6:.0f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
