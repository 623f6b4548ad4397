"""The audit log through a real gateway (decisions.md, Operators (wave 3)): every change
made with the real CLI and the console's real endpoints, sign-ins and failed sign-ins
included, is listed by GET /console/api/audit and `gateway audit list` with its actor,
target and changes; owners only; cursors and bad query values as the other lists; and no
key, password or session id anywhere in the database."""

from __future__ import annotations

import getpass
import subprocess
import time

import pytest

from tests.console.rpc_double import Chain, RpcDouble, address
from tests.console.support import PASSWORD, ConsoleClient, create_user, error_type
from tests.console.test_purchases import TOKEN, TREASURY, purchases_config
from tests.support.gateway_process import GATEWAY, GatewayProcess

CLI = f"cli:{getpass.getuser()}"
OWNER = "owner@example.com"
WRONG = "a wrong password 9f3e1a never to be stored"


@pytest.fixture(scope="module")
def chain():
    chain = Chain()
    with RpcDouble(chain) as double:
        chain.url = double.url
        yield chain


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, chain):
    folder = tmp_path_factory.mktemp("audit")
    with GatewayProcess(folder, extra_config=purchases_config(chain.url, 6)) as process:
        create_user(process, OWNER)
        yield process


def entries(client: ConsoleClient, **query: str) -> list[dict]:
    """Every entry, newest first, through the cursors."""
    found: list[dict] = []
    cursor = None
    while True:
        params = {**query, "limit": "200", **({"cursor": cursor} if cursor else {})}
        listed = client.get("/console/api/audit", params=params)
        assert listed.status_code == 200, listed.text
        found += listed.json()["data"]
        cursor = listed.json()["next_cursor"]
        if cursor is None:
            return found


def last(client: ConsoleClient, action: str) -> dict:
    return entries(client, action=action)[0]


def test_cli_changes_are_recorded_as_the_os_user(gateway, owner):
    pid = gateway.create_project("audited", "--balance", "5", "--rpm", "30")
    gateway.cli("projects", "update", pid, "--budget", "12.5", "--tpm", "none")
    created = gateway.cli("keys", "create", "--project", pid, "--scopes", "inference,receipts")
    gateway.cli("keys", "update", created["prefix"], "--rpm", "7")
    gateway.cli("keys", "revoke", created["prefix"])
    gateway.cli("payments", "record", "--project", pid, "12.5", "--reference", "INV-7")
    create_user(gateway, "cli-made@example.com")
    user = gateway.cli("users", "grant", "cli-made@example.com", "--project", pid)
    gateway.cli("users", "disable", "cli-made@example.com")
    gateway.cli("projects", "archive", pid)

    project, key = {"type": "project", "id": pid}, {"type": "key", "id": created["id"]}
    expected = {
        "project.create": (project, {"name": "audited", "rpm": 30}),
        "credit.add": (project, {"amount": "5.000000"}),
        "project.update": (project, {"monthly_budget": "12.500000", "tpm": None}),
        "key.create": (
            key,
            {"project": pid, "scopes": ["inference", "receipts"]},
        ),
        "key.update": (key, {"rpm": 7}),
        "key.revoke": (key, {"state": "revoked"}),
        "user.create": (
            {"type": "user", "id": user["id"]},
            {"email": "cli-made@example.com", "role": "member"},
        ),
        "user.grant": ({"type": "user", "id": user["id"]}, {"project": pid}),
        "user.disable": ({"type": "user", "id": user["id"]}, {"disabled": True}),
        "project.archive": (project, {"state": "archived"}),
    }
    for action, (target, changes) in expected.items():
        entry = last(owner, action)
        assert entry["object"] == "audit_entry" and entry["id"].startswith("aud_")
        assert (entry["actor"], entry["target"], entry["changes"]) == (CLI, target, changes), entry
        assert entry["request_id"] is None  # not a console request
        assert entry["at"].endswith("Z")
    payment = last(owner, "payment.record")
    assert payment["target"] == project and payment["actor"] == CLI
    assert payment["changes"]["amount"] == "12.500000"
    assert payment["changes"]["reference"] == "INV-7"
    assert payment["changes"]["payment"].startswith("pay_")
    # The first user, made before the gateway served: the owner, by the CLI.
    (first,) = [e for e in entries(owner, action="user.create") if e["changes"]["email"] == OWNER]
    assert first["changes"]["role"] == "owner" and first["actor"] == CLI


def test_console_changes_are_the_signed_in_users_under_their_request(gateway, owner, chain):
    made = {}  # action -> the response whose request made it
    made["project.create"] = owner.post("/console/api/projects", {"name": "web"})
    pid = made["project.create"].json()["id"]
    payer = address()
    made["project.update"] = owner.patch(
        f"/console/api/projects/{pid}", {"name": "web 2", "payer_addresses": [payer]}
    )
    made["key.create"] = owner.post(
        f"/console/api/projects/{pid}/keys", {"scopes": ["inference"], "name": "ci", "rpm": 3}
    )
    key = made["key.create"].json()
    made["key.revoke"] = owner.post(f"/console/api/keys/{key['prefix']}/revoke")
    made["payment.record"] = owner.post(
        f"/console/api/projects/{pid}/payments", {"amount": "2.25", "reference": "web-1"}
    )
    tx = chain.transfer(TOKEN, payer, TREASURY, 1_500_000, block=chain.head - 5)
    made["purchase.credit"] = owner.post(f"/console/api/projects/{pid}/purchases", {"tx_hash": tx})
    for action, response in made.items():
        assert response.status_code in (200, 201), (action, response.text)
        request_id = response.headers["x-request-id"]
        matching = [e for e in entries(owner, action=action) if e["request_id"] == request_id]
        assert len(matching) >= 1, action
        assert all(e["actor"] == f"user:{OWNER}" for e in matching)
        assert all(e["target"]["id"] in (pid, key["id"]) for e in matching)
        # The request's access line names the same id: the entry links to it.
        deadline = time.monotonic() + 5
        while request_id not in gateway.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert request_id in gateway.log()

    updates = [
        e
        for e in entries(owner, action="project.update")
        if e["request_id"] == made["project.update"].headers["x-request-id"]
    ]
    assert sorted(tuple(e["changes"]) for e in updates) == [("name",), ("payer_addresses",)]
    assert last(owner, "key.create")["changes"] == {
        "project": pid,
        "scopes": ["inference"],
        "rpm": 3,
        "name": "ci",
    }
    assert last(owner, "payment.record")["changes"]["amount"] == "2.250000"
    purchase = last(owner, "purchase.credit")
    assert purchase["changes"] == {
        "tx_hash": tx,
        "sender": payer,
        "token_units": "1500000",
        "amount": "1.500000",
    }


def test_sign_ins_and_failed_sign_ins(gateway):
    email = "signs-in@example.com"
    create_user(gateway, email)
    client = ConsoleClient(gateway)
    failed = client.login(email, WRONG)
    assert failed.status_code == 401
    signed = client.login(email)
    assert signed.status_code == 200
    user_id = signed.json()["user"]["id"]
    client.close()
    owner = ConsoleClient(gateway)
    assert owner.login(OWNER).status_code == 200
    (miss,) = [
        e
        for e in entries(owner, action="session.sign_in_failed")
        if e["request_id"] == failed.headers["x-request-id"]
    ]
    assert miss["actor"] == "anonymous"
    assert miss["target"] == {"type": "user", "email": email}
    (hit,) = [
        e
        for e in entries(owner, action="session.sign_in")
        if e["request_id"] == signed.headers["x-request-id"]
    ]
    assert hit["actor"] == f"user:{email}" and hit["target"] == {"type": "user", "id": user_id}
    assert hit["changes"] == {} and miss["changes"] == {}
    owner.close()


def test_members_are_refused(gateway, member):
    listed = member.get("/console/api/audit")
    assert listed.status_code == 403 and error_type(listed) == "forbidden"
    assert member.get("/console/audit").status_code == 403
    assert 'href="/console/audit"' not in member.get("/console/projects").text


def test_pages_of_entries_through_the_cursors(gateway, owner):
    everything = entries(owner)
    assert len(everything) >= 5
    seen: list[dict] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        listed = owner.get("/console/api/audit", params=params).json()
        assert listed["object"] == "list" and len(listed["data"]) <= 2
        seen += listed["data"]
        cursor = listed["next_cursor"]
        if cursor is None:
            break
    newer = entries(owner)  # this test's own sign-in is not among them: it came before
    assert [e["id"] for e in seen] == [e["id"] for e in newer]
    times = [e["at"] for e in seen]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("limit", "0"),
        ("limit", "201"),
        ("limit", "²"),
        ("limit", ""),
        ("cursor", "abc"),
        ("cursor", "-1"),
        ("cursor", str(2**63)),
        ("action", "project.delete"),
        ("actor", "x" * 331),
    ],
)
def test_bad_query_values_are_400_naming_them(owner, name, value):
    for path in ("/console/api/audit", "/console/audit"):
        response = owner.get(path, params={name: value})
        assert response.status_code == 400, (path, response.text[:200])
        if path.startswith("/console/api"):
            error = response.json()["error"]
            assert error["type"] == "invalid_request" and error["param"] == name


def test_the_page_lists_and_filters_with_the_filters_in_the_url(gateway, owner):
    gateway.create_project("paged")
    home = owner.get("/console/projects").text
    assert 'href="/console/audit"' in home
    page = owner.get("/console/audit")
    assert page.status_code == 200 and "Audit log" in page.text
    assert "project.create" in page.text and "session.sign_in" in page.text
    only = owner.get("/console/audit", params={"action": "project.create", "actor": CLI}).text
    assert '<option value="project.create" selected>' in only
    assert "<code>session.sign_in</code>" not in only
    assert "<code>project.create</code>" in only
    older = owner.get("/console/audit", params={"limit": "1", "action": "project.create"}).text
    assert "Older entries" in older and "action=project.create" in older


def test_gateway_audit_list(gateway, owner):
    listed = gateway.cli("audit", "list", "--limit", "3")
    assert listed["object"] == "list" and len(listed["data"]) == 3
    api = owner.get("/console/api/audit", params={"limit": "3"}).json()
    assert listed == api  # the console's list object, entry for entry
    more = gateway.cli("audit", "list", "--limit", "3", "--cursor", listed["next_cursor"])
    assert more["data"][0]["id"] not in {e["id"] for e in listed["data"]}
    only = gateway.cli("audit", "list", "--action", "key.revoke")
    assert {e["action"] for e in only["data"]} == {"key.revoke"}

    text = subprocess.run(
        [GATEWAY, "audit", "list", "--limit", "2", "--config", str(gateway.config_path)],
        capture_output=True,
        text=True,
        env=gateway.env,
        timeout=60,
    )
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["at", "actor", "action", "target", "changes"]
    assert lines[-1].startswith("older: gateway audit list --cursor ")
    for bad in (["--limit", "0"], ["--limit", "201"], ["--cursor", "x"]):
        refused = gateway.cli("audit", "list", *bad, check=False)
        assert refused["error"]["type"] == "invalid_request"


def test_no_key_password_or_session_in_the_database(gateway, owner):
    pid = gateway.create_project("secrets")
    secret = gateway.create_key(pid)
    web_key = owner.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}).json()
    client = ConsoleClient(gateway)
    client.login(OWNER, WRONG)
    client.login(OWNER)
    session = client.session
    assert session
    client.close()
    listed = owner.get("/console/api/audit").text
    data = gateway.folder / "data"
    stored = b"".join(
        path.read_bytes() for path in data.iterdir() if path.name.startswith("gateway.db")
    )
    for value in (secret, web_key["key"], PASSWORD, WRONG, session):
        assert value.encode() not in stored
        assert value not in listed
