"""``obleth serve --workers N`` as the tests of its workers run it: a real process tree
sharing a real Redis (the fixtures starting one are in ``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet

import httpx

from tests.cli.processes import children, command_line
from tests.cluster.pods import HOST, ServePod, free_port

TOKEN = "serve-workers-token-0123456789"
LIMIT = 3
"""The budget of the whole ``obleth serve``, all workers together."""
WAIT_S = 30.0


class ServeWorkers(ServePod):
    """``obleth serve --workers N --redis-url ...`` with the admin API on a port of its own."""

    def __init__(self, upstream: str, redis_url: str, pool: str, *, workers: int = 2) -> None:
        self.admin_port = free_port()
        self.workers = workers
        super().__init__(
            [upstream],
            args=(
                *("--workers", str(workers), "--redis-url", redis_url, "--pool", pool),
                *("--max-in-flight", str(LIMIT), "--admin-port", str(self.admin_port)),
            ),
            # a killed worker's pod leaves the pool within 2 s, not the default 10 s
            env={"OBLETH_ADMIN_TOKEN": TOKEN, "OBLETH_LEASE_TTL_S": "2"},
            name="serve-workers",
        )

    def worker_pids(self) -> set[int]:
        """The worker processes running now (not multiprocessing's resource tracker)."""
        assert self.pid is not None
        return {pid for pid in children(self.pid) if "spawn_main" in command_line(pid)}

    def wait_for_workers(self, *, besides: AbstractSet[int] = frozenset()) -> set[int]:
        """The workers, once ``self.workers`` run, none of them in ``besides``, and the
        Redis pool counts each as a live pod."""
        deadline = time.monotonic() + WAIT_S
        while True:
            pids = self.worker_pids()
            if len(pids) == self.workers and not pids & besides and self.live_pods() == len(pids):
                return pids
            assert time.monotonic() < deadline, f"workers {pids}:\n{self.log_tail()}"
            time.sleep(0.05)

    def live_pods(self) -> int | None:
        """``cluster.live_pods`` of the admin API's status, as one of the workers answers."""
        url = f"http://{HOST}:{self.admin_port}/api/v1/status"
        try:
            answer = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        except httpx.TransportError:
            return None
        live: int = answer.json()["cluster"]["live_pods"]
        return live

    def wait(self, timeout_s: float = WAIT_S) -> int:
        """The exit status of ``obleth serve`` once it has exited."""
        return self._require_process().wait(timeout=timeout_s)
