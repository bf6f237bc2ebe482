"""Reading what ``tests.servers.app`` wrote down: how many requests the app held at once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ledger:
    """The file every process of a server appends ``+ <pid>`` and ``- <pid>`` lines to."""

    path: Path

    def entries(self) -> list[tuple[int, int]]:
        """``(+1 or -1, pid)`` per whole line, in the order the lines were written."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        entries = []
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):  # a line being written is read next time
                sign, pid = line.split()
                entries.append((1 if sign == "+" else -1, int(pid)))
        return entries

    def holding(self) -> int:
        """Requests the app holds now."""
        return sum(step for step, _ in self.entries())

    def peak(self) -> int:
        """The most requests the app held at once, across all its processes."""
        held = peak = 0
        for step, _ in self.entries():
            held += step
            peak = max(peak, held)
        return peak

    def held(self) -> int:
        """Requests the app has started to hold, in all."""
        return sum(1 for step, _ in self.entries() if step > 0)

    def pids(self) -> set[int]:
        """The processes that held requests."""
        return {pid for step, pid in self.entries() if step > 0}

    def wait_holding(self, count: int, timeout_s: float = 20.0) -> None:
        """Return once the app holds ``count`` requests; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.holding() != count:
            assert time.monotonic() < deadline, (
                f"the app held {self.holding()} requests, not {count}, for {timeout_s} s"
            )
            time.sleep(0.01)
