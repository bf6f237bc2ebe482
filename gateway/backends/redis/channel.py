"""This pod's notification channel (``obleth:{<pool>}:pod:<pod id>``) on Redis pub/sub.

Grants and drops for this pod's waiters arrive here, one message per release that served
them (never a broadcast); so do the pool's news: a roll call that awaits this pod, or a
pod that joined and must be told of (a nudge to call Redis). A message lost on the way is
not lost for good: after any reconnect a heartbeat picks up what was missed.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.backends.redis.calls import UNREACHABLE, Caller
from gateway.backends.redis.connect import Client
from gateway.backends.redis.failure_mode import FailureMode
from gateway.backends.redis.leases import Leases
from gateway.backends.redis.pod import PodState
from gateway.backends.redis.wire import News, Note, parse_notes

#: The longest a lost notification connection waits before it tries again.
RESUBSCRIBE_MAX_S = 0.2


class PodChannel:
    """Listens on this pod's channel; ``subscribed`` is set once it first listens."""

    def __init__(
        self,
        pod: PodState,
        client: Client,
        caller: Caller,
        leases: Leases,
        failure: FailureMode,
    ) -> None:
        self._pod = pod
        self._client = client
        self._caller = caller
        self._leases = leases
        self._failure = failure
        self.subscribed = asyncio.Event()

    async def listen(self) -> None:
        """Read this pod's channel; after any reconnect, a heartbeat picks up what was missed.

        A lost subscription is tried again within ``RESUBSCRIBE_MAX_S``: after a Redis
        restart the pods' subscriptions are how a roll call knows who is live.
        """
        pod = self._pod
        channel = pod.keys.channel(pod.id)
        backoff = 0.02
        first = True
        while pod.running:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(channel)
                self.subscribed.set()
                backoff = 0.02
                if not first:
                    if pod.fallback is not None:
                        self._failure.probe_now.set()
                    pod.batch.heartbeat = True
                    self._caller.kick()
                first = False
                while pod.running:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=pod.interval_s
                    )
                    if message is not None and message.get("type") == "message":
                        notes, news = _notes_of(message.get("data"))
                        for note in notes:
                            self._leases.on_note(note)
                        if news.roll_call or news.membership:
                            self._on_news(news)
            except UNREACHABLE:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RESUBSCRIBE_MAX_S, pod.interval_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_news(self, news: News) -> None:
        """What the pod's channel said besides its waiters' notes."""
        pod = self._pod
        if news.roll_call:
            if pod.fallback is not None:
                self._failure.probe_now.set()
                return
            pod.batch.heartbeat = True
            pod.batch.reassert = True
        if news.membership:
            pod.batch.ping = True
        self._caller.kick()


def _notes_of(data: object) -> tuple[list[Note], News]:
    if not isinstance(data, str):
        return [], News()
    return parse_notes(data.split())
