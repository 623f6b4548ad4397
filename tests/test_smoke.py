import httpx


def test_models_lists_echo_for_a_fresh_key(gateway, auth):
    _, key = auth
    response = httpx.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert response.headers["x-request-id"].startswith("req_")
    ids = [m["id"] for m in response.json()["data"]]
    assert "echo-1" in ids
