"""Release-once state of a permit: the one place that decides whether a release counts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ReleaseOnce:
    """Turns any number of release attempts into exactly one effective release.

    ``claim()`` answers True to the first caller only; every path that can end a request
    (normal end, streamed end, exception, disconnect, cancellation) calls it, and only the
    winner gives the seats back.
    """

    released: bool = field(default=False)

    def claim(self) -> bool:
        if self.released:
            return False
        self.released = True
        return True
