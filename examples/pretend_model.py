"""The pretend model the examples serve, whatever their framework: an OpenAI-style chat
completion that writes one word every ``WORD_S`` seconds, and a count of the requests the
app is serving at once (``/stats`` in each example), which shows the gateway's limit
holding.

Framework-free on purpose: each example is only the wiring of its framework and the
gateway.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: the seconds the "model" takes per word of its answer
WORD_S = 0.05
WORDS = ("Seats", "are", "handed", "out", "fairly", "between", "tenants.")


class InvalidChat(ValueError):
    """A request body the endpoint cannot answer; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def document(self) -> dict[str, object]:
        """The OpenAI-style error body of a 400 answer."""
        error = {"message": str(self), "type": "invalid_request_error", "param": self.param}
        return {"error": error | {"code": None}}


@dataclass(frozen=True)
class Chat:
    """One chat request: the answer it will get, and whether it streams."""

    words: list[str]
    stream: bool
    created: int

    @classmethod
    def parse(cls, body: object) -> Chat:
        """The request of a decoded JSON body; raises ``InvalidChat``."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise InvalidChat('the body must be a JSON object with a "messages" list', "messages")
        length = body.get("max_tokens", len(WORDS))
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidChat("max_tokens must be a whole number of at least 1", "max_tokens")
        words = [WORDS[i % len(WORDS)] for i in range(length)]
        return cls(words, bool(body.get("stream")), int(time.time()))

    @classmethod
    def parse_bytes(cls, raw: bytes) -> Chat:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        return cls.parse(body)

    @property
    def seconds(self) -> float:
        """How long the whole answer takes to write."""
        return WORD_S * len(self.words)

    def completion(self) -> dict[str, object]:
        """The whole answer, as ``chat.completion``."""
        message = {"role": "assistant", "content": " ".join(self.words)}
        return {
            **self._envelope("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }

    def events(self) -> Iterator[str]:
        """The answer as server-sent events: one ``chat.completion.chunk`` per word, then
        ``[DONE]``. The caller waits ``WORD_S`` before each."""
        for index, word in enumerate(self.words):
            delta = {"content": word if index == 0 else " " + word}
            chunk = {
                **self._envelope("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    def _envelope(self, kind: str) -> dict[str, object]:
        created = self.created
        return {"id": f"chatcmpl-{created}", "object": kind, "created": created, "model": "example"}


class InFlight:
    """How many requests the app is serving now, and the most it served at once.

    ``with in_flight:`` around the work of a request (the whole stream, for a streamed
    answer). Thread-safe, so that threaded WSGI servers can share it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.served = 0

    def __enter__(self) -> InFlight:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1
            self.served += 1

    def stats(self) -> dict[str, int]:
        """What ``/stats`` answers: ``in_flight``, ``peak`` and ``served``."""
        return {"in_flight": self.now, "peak": self.peak, "served": self.served}
