"""``obleth serve --admin-port``: the admin API on a listener of its own, beside the
gateway's port, in a real ``obleth serve`` process."""

from __future__ import annotations

import httpx

from tests.cluster.pods import ServePod, free_port

TOKEN = "serve-admin-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
NOWHERE = "http://127.0.0.1:9"  # an upstream nobody answers: the admin API needs none


def test_serve_answers_the_admin_api_on_its_own_port() -> None:
    """With a token, the limit is read and changed on the admin port; the gateway's port
    does not serve the admin API."""
    admin_port = free_port()
    pod = ServePod(
        [NOWHERE],
        args=("--max-in-flight", "7", "--admin-port", str(admin_port)),
        env={"OBLETH_ADMIN_TOKEN": TOKEN},
        name="serve-admin",
    )
    with pod, httpx.Client(trust_env=False, timeout=5) as http:
        admin = f"http://127.0.0.1:{admin_port}/api/v1/capacity"
        assert http.get(admin, headers=BEARER).json() == {"max_in_flight": 7}
        changed = http.put(admin, headers=BEARER, json={"max_in_flight": 12})
        assert changed.json() == {"max_in_flight": 12}
        assert http.get(admin, headers=BEARER).json() == {"max_in_flight": 12}
        assert http.get(admin).status_code == 401
        assert http.get(f"{pod.url}/api/v1/capacity", headers=BEARER).status_code != 200


def test_without_a_token_serve_opens_no_admin_port() -> None:
    admin_port = free_port()
    pod = ServePod([NOWHERE], args=("--admin-port", str(admin_port)), name="serve-no-admin")
    with pod, httpx.Client(trust_env=False, timeout=2) as http:
        assert http.get(f"{pod.url}/healthz").status_code == 200
        try:
            http.get(f"http://127.0.0.1:{admin_port}/api/v1/capacity")
        except httpx.ConnectError:
            return
        raise AssertionError("the admin port answered, though no token is set")
