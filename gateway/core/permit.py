"""Release-once state of a permit: the one place that decides whether a release counts."""

from __future__ import annotations


class ReleaseOnce:
    """Turns any number of release attempts into exactly one effective release.

    ``claim()`` answers True to the first caller only; every path that can end a request
    (normal end, streamed end, exception, disconnect, cancellation) calls it, and only the
    winner gives the seats back.
    """

    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = False

    def claim(self) -> bool:
        if self.released:
            return False
        self.released = True
        return True
