"""Several sandbox nodes, over real processes: two `gateway sandbox-node`s (A with 2 slots,
B with 1) behind one `gateway serve` listing both as `[[sandbox_nodes]]`.

Which node ran an execution is read from the nodes' own logs (each logs the execution ids
it ran); the gateway's view of each node (up or down, slots in use) from its /healthz.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest

from tests.operations.test_doctor import doctor
from tests.sandbox_e2e.helpers import (
    PER_EXECUTION,
    PER_SECOND,
    NodeProcess,
    Tenant,
    executing_node,
    expected_cost,
    node_slot_processes,
    running_node,
)
from tests.sandbox_e2e.test_disconnect import receipt_ids, send_and_leave_open, wait_for
from tests.support.gateway_process import GatewayProcess, free_port

SLOW = "import time; time.sleep(5)"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """(A, B): two real nodes, with 2 slots and 1."""
    with (
        running_node(tmp_path_factory.mktemp("node-a"), 2) as a,
        running_node(tmp_path_factory.mktemp("node-b"), 1) as b,
    ):
        yield executing_node(a), executing_node(b)


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


def nodes_config(*nodes: tuple[str, object, int]) -> str:
    """`[[sandbox_nodes]]` entries for (url, secret_file, max_concurrent), in that order."""
    entries = "".join(
        f'\n[[sandbox_nodes]]\nurl = "{url}"\nsecret_file = "{secret}"\nmax_concurrent = {slots}\n'
        for url, secret, slots in nodes
    )
    pricing = f'per_execution = "{PER_EXECUTION}"\nper_second = "{PER_SECOND}"\n'
    return entries + "\n[sandbox_pricing]\n" + pricing


def gateway_on(tmp_path, *nodes: tuple[NodeProcess, int]) -> GatewayProcess:
    config = nodes_config(*((node.url, node.secret_file, slots) for node, slots in nodes))
    return GatewayProcess(tmp_path, extra_config=config)


def node_states(gateway: GatewayProcess) -> dict[str, dict]:
    answer = httpx.get(gateway.url + "/healthz", timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["sandbox_nodes"]


def in_use(gateway: GatewayProcess) -> dict[str, int]:
    return {name: state["in_use"] for name, state in node_states(gateway).items()}


def status_of(gateway: GatewayProcess, name: str) -> str:
    return node_states(gateway)[name]["status"]


def ran_on(execution_id: str, *nodes: NodeProcess) -> list[NodeProcess]:
    """The nodes whose log says they ran `execution_id` (waits for the log line)."""
    line = f"execution {execution_id} runtime="
    return wait_for(
        lambda: [node for node in nodes if line in node.log_path.read_text()], 5, "log line"
    )


def slots(first: int, second: int) -> dict[str, int]:
    """The slots in use the gateway shows for its first and second node."""
    return {"sandbox_nodes[0]": first, "sandbox_nodes[1]": second}


def python(tenant: Tenant, client: httpx.Client, sandbox: str, code: str) -> httpx.Response:
    return tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code)


def run(tenant: Tenant, sandbox: str, code: str) -> httpx.Response:
    """One execution on its own connection (for runs sent from several threads)."""
    with httpx.Client(timeout=60) as own:
        return python(tenant, own, sandbox, code)


def cost_of(tenant: Tenant, client: httpx.Client, answer: httpx.Response) -> Decimal:
    assert answer.status_code == 200, answer.text
    receipt = tenant.receipt(client, answer.json()["receipt_id"])
    assert Decimal(receipt["cost"]) == expected_cost(receipt["usage"]["duration_ms"])
    return Decimal(receipt["cost"])


def test_the_node_with_the_most_free_slots_serves_and_capacity_is_their_sum(
    nodes, client, tmp_path
):
    a, b = nodes
    # B is listed first: it serves only when it has as many free slots as A.
    with gateway_on(tmp_path, (b, 1), (a, 2)) as gateway:
        tenant = Tenant(gateway, balance="5.00")  # a hold per run: 30 s of the limit
        sandbox = tenant.sandbox("python", "--timeout-s", "30")
        credits, _ = tenant.account()

        quick = python(tenant, client, sandbox, "print(1)")
        assert ran_on(quick.json()["id"], a, b) == [a]  # 2 free slots against 1
        costs = [cost_of(tenant, client, quick)]

        # Each run takes the most free slots, the first listed of equals: A (2 vs 1), then
        # B (1 vs 1), then A (1 vs 0). Then all 3 slots, the sum of both nodes', run.
        with ThreadPoolExecutor(3) as threads:
            slow = []
            for expected in (slots(0, 1), slots(1, 1), slots(1, 2)):
                slow.append(threads.submit(run, tenant, sandbox, SLOW))
                wait_for(lambda e=expected: in_use(gateway) == e, 10, f"slots {expected}")
            metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
            assert 'gateway_sandbox_node_slots_in_use{node="sandbox_nodes[1]"} 2.0' in metrics
            assert 'gateway_sandbox_node_up{node="sandbox_nodes[0]"} 1.0' in metrics

            # Both nodes full: 503 with retry-after 5, and nothing billed for it.
            refused = python(tenant, client, sandbox, "1")
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "5"
            assert refused.json()["error"]["type"] == "service_unavailable"
            assert "x-receipt-id" not in refused.headers
            answers = [future.result() for future in slow]

        assert [ran_on(answer.json()["id"], a, b) for answer in answers] == [[a], [b], [a]]
        costs += [cost_of(tenant, client, answer) for answer in answers]
        assert in_use(gateway) == slots(0, 0)
        assert tenant.account() == (credits - sum(costs), 0)
        assert len(receipt_ids(gateway, tenant.project)) == 4


def test_a_stopped_node_is_skipped_and_used_again_once_back(nodes, client, tmp_path):
    a, b = nodes
    with gateway_on(tmp_path, (a, 2), (b, 1)) as gateway:
        tenant = Tenant(gateway)
        sandbox = tenant.sandbox("python")
        a.stop()
        try:
            # The gateway has not noticed yet: a job sent to A finds its connection refused
            # before A could have run it, and goes to B. None waits, none fails.
            for i in range(3):
                sent = time.monotonic()
                answer = python(tenant, client, sandbox, f"print({i})")
                assert answer.status_code == 200, answer.text
                assert time.monotonic() - sent < 5
                assert ran_on(answer.json()["id"], a, b) == [b]
            assert status_of(gateway, "sandbox_nodes[0]") == "down"
        finally:
            a.start()
        wait_for(lambda: status_of(gateway, "sandbox_nodes[0]") == "up", 10, "A back up")
        answer = python(tenant, client, sandbox, "print(9)")
        assert ran_on(answer.json()["id"], a, b) == [a]


def test_a_frozen_node_is_skipped_without_making_requests_wait(nodes, client, tmp_path):
    """A stopped (SIGSTOP) node still accepts connections but never answers: only its
    failed health check keeps executions from waiting on it for their whole timeout."""
    a, b = nodes
    with gateway_on(tmp_path, (a, 2), (b, 1)) as gateway:
        tenant = Tenant(gateway)
        sandbox = tenant.sandbox("python")
        os.killpg(a.process.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: status_of(gateway, "sandbox_nodes[0]") == "down", 10, "A down")
            for i in range(3):
                sent = time.monotonic()
                answer = python(tenant, client, sandbox, f"print({i})")
                assert answer.status_code == 200, answer.text
                assert time.monotonic() - sent < 5  # not A's 10 s timeout and more
                assert ran_on(answer.json()["id"], a, b) == [b]
        finally:
            os.killpg(a.process.pid, signal.SIGCONT)
        wait_for(lambda: status_of(gateway, "sandbox_nodes[0]") == "up", 10, "A back up")
        answer = python(tenant, client, sandbox, "print(9)")
        assert ran_on(answer.json()["id"], a, b) == [a]


def test_a_node_busy_with_another_instances_run_sends_the_job_on(nodes, tmp_path):
    """Two gateways share node B: the one that did not fill it still counts B's slot as
    free, sends the job there, is told "busy" (nothing ran) and sends it to A instead."""
    a, b = nodes
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with (
        gateway_on(tmp_path / "first", (b, 1)) as first,
        gateway_on(tmp_path / "second", (b, 1), (a, 2)) as second,
    ):
        filler, tenant = Tenant(first, balance="5.00"), Tenant(second)
        filler_sandbox, sandbox = filler.sandbox("python", "--timeout-s", "30"), tenant.sandbox()
        with ThreadPoolExecutor(2) as threads:
            held = threads.submit(run, filler, filler_sandbox, "import time; time.sleep(8)")
            wait_for(lambda: node_slot_processes(b.process.pid), 10, "B's slot taken")
            # A has more free slots: fill one of them here, so that B is the first choice.
            both = threads.submit(run, tenant, sandbox, "import time; time.sleep(3)")
            wait_for(lambda: in_use(second) == slots(0, 1), 10, "one of A's slots taken")
            answer = run(tenant, sandbox, "print(1)")
            assert answer.status_code == 200, answer.text
            assert ran_on(answer.json()["id"], a, b) == [a]
            assert held.result().status_code == both.result().status_code == 200


def test_no_node_reachable_is_sandbox_error_and_not_billed(client, tmp_path):
    dead = [(f"http://127.0.0.1:{free_port()}", "data/sandbox-secret", 1) for _ in range(2)]
    with GatewayProcess(tmp_path, extra_config=nodes_config(*dead)) as gateway:
        tenant = Tenant(gateway)
        sandbox = tenant.sandbox("python")
        before = tenant.account()
        answer = python(tenant, client, sandbox, "print(1)")
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["type"] == "sandbox_error"
        assert "x-receipt-id" not in answer.headers
        assert tenant.account() == before
        # Both are known down now: refused at once, without a connection attempt.
        assert {s["status"] for s in node_states(gateway).values()} == {"down"}
        metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
        assert 'gateway_sandbox_node_up{node="sandbox_nodes[1]"} 0.0' in metrics
        answer = python(tenant, client, sandbox, "print(1)")
        assert answer.status_code == 502
        assert answer.json()["error"]["message"] == "No sandbox node is reachable."
        assert tenant.account() == before


def test_a_client_that_leaves_frees_its_slot_when_its_node_does(nodes, client, tmp_path):
    """Every slot of both nodes taken, one client leaves: its run is stopped on its node
    and billed as cancelled, and the slot the gateway frees is free on that node too (a
    slot freed early would send the next run to a node still busy: a 503)."""
    a, b = nodes
    with gateway_on(tmp_path, (b, 1), (a, 2)) as gateway:
        tenant, other = Tenant(gateway, balance="5.00"), Tenant(gateway, balance="5.00")
        sandbox = tenant.sandbox("python", "--timeout-s", "60")
        other_sandbox = other.sandbox("python", "--timeout-s", "30")
        credits, _ = tenant.account()
        body = {"sandbox_id": sandbox, "runtime": "python", "code": "import time; time.sleep(30)"}
        leaving = send_and_leave_open(gateway, tenant.key, body)  # to A: 2 free slots
        wait_for(lambda: node_slot_processes(a.process.pid), 10, "the program started on A")
        with ThreadPoolExecutor(3) as threads:
            held = [threads.submit(run, other, other_sandbox, SLOW) for _ in range(2)]
            wait_for(lambda: in_use(gateway) == slots(1, 2), 10, "every slot taken")
            time.sleep(1.0)  # the leaving run runs a while: a positive time to bill
            leaving.close()
            wait_for(lambda: in_use(gateway)["sandbox_nodes[1]"] == 1, 10, "its slot freed")
            answer = run(other, other_sandbox, "print(2)")
            assert answer.status_code == 200, answer.text
            assert ran_on(answer.json()["id"], a, b) == [a]
            assert all(future.result().status_code == 200 for future in held)

        wait_for(lambda: tenant.account()[1] == 0, 10, "reserved back to 0")
        [receipt_id] = receipt_ids(gateway, tenant.project)
        receipt = tenant.receipt(client, receipt_id)
        assert receipt["status"] == "cancelled"
        ran_ms = receipt["usage"]["duration_ms"]
        assert 1000 <= ran_ms < 10_000
        assert tenant.account() == (credits - expected_cost(ran_ms), 0)
        assert in_use(gateway) == slots(0, 0)


def test_doctor_checks_every_node(nodes, tmp_path):
    a, _ = nodes
    dead = f"http://127.0.0.1:{free_port()}"
    config = nodes_config((a.url, a.secret_file, 2), (dead, "data/sandbox-secret", 1))
    report = doctor(GatewayProcess(tmp_path, extra_config=config))[1]
    checks = {c["name"]: c for c in report["checks"] if c["name"].startswith("sandbox node")}
    assert checks["sandbox node sandbox_nodes[0]"]["ok"] is True
    assert checks["sandbox node sandbox_nodes[0]"]["detail"].startswith("reachable and isolated")
    assert checks["sandbox node sandbox_nodes[1]"]["ok"] is False
    assert checks["sandbox node sandbox_nodes[1]"]["detail"].startswith(f"{dead} is not reachable")
