"""`gateway sandboxes create`: one JSON record with an sbx_ id, limits within bounds."""

from __future__ import annotations

import pytest

from tests.support.gateway_process import CliFailed


def test_create_prints_the_configuration_with_defaults(gateway):
    project = gateway.create_project("sandbox-cli")
    created = gateway.cli("sandboxes", "create", "--project", project, "--runtime", "node")
    assert created["id"].startswith("sbx_")
    assert {k: created[k] for k in ("object", "project", "runtime", "timeout_s", "memory_mb")} == {
        "object": "sandbox",
        "project": project,
        "runtime": "node",
        "timeout_s": 10,
        "memory_mb": 256,
    }


@pytest.mark.parametrize(
    "options",
    [("--timeout-s", "0"), ("--timeout-s", "301"), ("--memory-mb", "31"), ("--memory-mb", "4097")],
)
def test_limits_beyond_bounds_are_refused(gateway, options):
    project = gateway.create_project("sandbox-cli")
    with pytest.raises(CliFailed) as failed:
        gateway.cli("sandboxes", "create", "--project", project, "--runtime", "bash", *options)
    assert failed.value.output["error"]["type"] == "invalid_request"
    assert options[0] in failed.value.output["error"]["message"]


def test_unknown_project_is_not_found(gateway):
    with pytest.raises(CliFailed) as failed:
        gateway.cli("sandboxes", "create", "--project", "prj_missing", "--runtime", "python")
    assert failed.value.output["error"]["type"] == "not_found"


def test_unknown_runtime_is_refused(gateway):
    done = gateway.cli(
        "sandboxes", "create", "--project", "prj_x", "--runtime", "ruby", check=False
    )
    # With --json an argument error is the error object; argparse lists the choices.
    assert done["error"]["type"] == "invalid_request"
    assert "python" in done["error"]["message"] and "ruby" in done["error"]["message"]
