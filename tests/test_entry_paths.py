"""What the gateway's own paths look like from outside: `GET /` leads a browser to the
console, and path templates are shown as `{name}` (GET /v1, metrics labels) even where
the parameter takes the rest of the path (model ids such as org/model)."""

from __future__ import annotations

import httpx

from tests.operations.test_metrics import samples, value
from tests.support.http import bearer


def test_the_root_redirects_to_the_console(gateway):
    root = httpx.get(gateway.url + "/")
    assert root.status_code == 303 and root.headers["location"] == "/console"
    followed = httpx.get(gateway.url + "/", follow_redirects=True)
    assert followed.status_code == 200 and followed.url.path == "/console/login"


def test_templates_show_their_parameters_plainly(gateway, auth):
    _, key = auth
    listed = httpx.get(gateway.url + "/v1", headers=bearer(key)).json()["data"]
    paths = {entry["path"] for entry in listed}
    assert "/v1/models/{model_id}" in paths
    assert not [path for path in paths if ":" in path]
    # The route still takes ids with a slash.
    model = httpx.get(gateway.url + "/v1/models/org/echo-2", headers=bearer(key))
    assert model.status_code == 200 and model.json()["id"] == "org/echo-2"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert ":path" not in metrics
    found = samples(metrics)
    labels = {"endpoint": "/v1/models/{model_id}", "method": "GET", "status": "200"}
    assert value(found, "gateway_requests_total", **labels) >= 1
