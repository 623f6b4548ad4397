"""Back up under load, restore into an empty folder, and the books and the log still hold:
balance = credits - sum of receipts, nothing left reserved, receipts verify, keys still work."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import time
from decimal import Decimal

import httpx

from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.http import bearer, chat_body


def cli(process: GatewayProcess, *args: str) -> dict:
    done = subprocess.run(
        [GATEWAY, *args, "--config", str(process.config_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def keep_busy(url: str, key: str, stop: threading.Event, sent: list[int]) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            sent.append(
                http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key)).status_code
            )


def test_backup_under_load_then_restore(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    original = GatewayProcess(tmp_path / "a").start()
    project = original.create_project("books", "--balance", "5")
    key = original.create_key(project, "inference,receipts")
    stop, sent = threading.Event(), []
    workers = [
        threading.Thread(target=keep_busy, args=(original.url, key, stop, sent)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1)
        made = cli(original, "backup", str(tmp_path / "backup"))
        time.sleep(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
        original.stop()
    assert set(sent) == {200} and len(sent) > 20
    assert made["secrets"] == ["key-pepper", "signing-key"]
    assert sorted(p.name for p in (tmp_path / "backup").iterdir()) == [
        "gateway.db",
        "key-pepper",
        "signing-key",
    ]
    assert all((tmp_path / "backup" / name).stat().st_mode & 0o077 == 0 for name in made["secrets"])

    restored = GatewayProcess(tmp_path / "b")
    cli(restored, "restore", str(tmp_path / "backup"))
    restored.start()
    try:
        with sqlite3.connect(tmp_path / "b" / "data" / "gateway.db") as db:
            costs = [
                row[0]
                for row in db.execute("SELECT cost FROM receipts WHERE project_id = ?", (project,))
            ]
            receipt = db.execute(
                "SELECT id FROM receipts ORDER BY created_at DESC LIMIT 1"
            ).fetchone()[0]
        assert 0 < len(costs) < len(sent)  # a snapshot taken mid-load
        shown = restored.cli("projects", "show", project)
        assert Decimal(shown["balance"]) == Decimal(5) - Decimal(sum(costs)) / 1_000_000
        assert Decimal(shown["reserved"]) == 0  # holds of the stopped process are released
        again = httpx.post(
            restored.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key)
        )
        assert again.status_code == 200  # the pepper came back with the database
        proof_url = f"{restored.url}/api/proofs/{receipt}"
        deadline = time.monotonic() + 10
        while httpx.get(proof_url).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # Against the restored deployment's own signing key, read through its config.
        verified = subprocess.run(
            [GATEWAY, "verify", proof_url, "--config", str(restored.config_path), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert json.loads(verified.stdout)["key_source"] == "config"
    finally:
        restored.stop()


def test_restore_never_overwrites(tmp_path):
    process = GatewayProcess(tmp_path).start()
    process.stop()
    cli(process, "backup", str(tmp_path / "backup"))
    done = subprocess.run(
        [
            GATEWAY,
            "restore",
            str(tmp_path / "backup"),
            "--config",
            str(process.config_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "move these aside first" in json.loads(done.stdout)["error"]["message"]
