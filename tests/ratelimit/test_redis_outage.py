"""A Redis that does not answer: keyed requests get 503 service_unavailable with
`retry-after` (the spec's answer for an unavailable dependency), never a 500 and never a
request let through unchecked; when Redis answers again, so does the gateway. A request
admitted before Redis went away still answers: its unused tokens, not given back, are
logged. A real gateway process and a real redis-server of the test's own, started and
killed."""

from __future__ import annotations

import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from tests.ratelimit.token_requests import SLOW, chat_body, post, slow_model_config
from tests.storage.backends import in_ci
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV

CHAT = {"model": "echo-1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


class RedisServer:
    def __init__(self, port: int, password: str) -> None:
        self.port, self.password = port, password
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                self.password,
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, password=self.password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def redis_server():
    if shutil.which("redis-server") is None:
        if in_ci():
            pytest.fail("CI=true and no redis-server installed: the Redis cases must run in CI")
        pytest.skip("redis-server is not installed")
    server = RedisServer(free_port(), "s3cret-pass")
    yield server
    server.kill()


@pytest.mark.redis
def test_an_unreachable_redis_gives_503_never_a_pass_or_a_500(tmp_path, redis_server):
    url = f"redis://:{redis_server.password}@127.0.0.1:{redis_server.port}/0"
    with GatewayProcess(tmp_path, extra_config=f'\n[ratelimit]\nurl = "{url}"\n') as gateway:
        project = gateway.create_project("outage")
        gateway.cli("credit", "add", "--project", project, "1.00")
        key = gateway.create_key(project, "inference", "--rpm", "1")

        def chat() -> httpx.Response:
            return httpx.post(
                gateway.url + "/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {key}"},
                timeout=10,
            )

        def assert_unavailable(response: httpx.Response) -> None:
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "service_unavailable"
            assert response.headers["retry-after"] == "1"
            assert "x-receipt-id" not in response.headers  # nothing ran, nothing billed

        assert_unavailable(chat())  # never started: refused, not let through
        redis_server.start()
        assert chat().status_code == 200
        assert chat().status_code == 429  # 1 rpm, counted in Redis
        redis_server.kill()
        assert_unavailable(chat())  # the pooled connection died with the server
        log = gateway.log()
    assert "not answering" in log and "answers again" in log
    assert "s3cret-pass" not in log
    assert "Traceback" not in log


@pytest.mark.redis
def test_tokens_not_given_back_to_a_gone_redis_are_logged_the_answer_stands(tmp_path, redis_server):
    url = f"redis://:{redis_server.password}@127.0.0.1:{redis_server.port}/0"
    redis_server.start()
    with FakeOpenAI(OPENAI_CREDENTIAL) as upstream:
        config = f'\n[ratelimit]\nurl = "{url}"\n' + slow_model_config(upstream.url)
        with GatewayProcess(tmp_path, extra_config=config, env=UPSTREAM_ENV) as gateway:
            project = gateway.create_project("give-back")
            gateway.cli("credit", "add", "--project", project, "1.00")
            key = gateway.create_key(
                project, "inference", "--tpm", "1000"
            )  # slow: what drains meanwhile is not given back
            with ThreadPoolExecutor(1) as thread:
                answer = thread.submit(post, gateway.url, key, chat_body(SLOW))
                deadline = time.monotonic() + 10
                while not upstream.sent(model="slow"):  # admitted: at the upstream now
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                redis_server.kill()
                response = answer.result()
            log = gateway.log()
    assert response.status_code == 200, response.text
    assert "unused tokens not given back" in log
    assert "Traceback" not in log
