"""A Flask app with an OpenAI-style chat endpoint, behind ``WSGIGatewayMiddleware``.

Run it from the repository's root (``pip install -e . flask gunicorn`` first), under
gunicorn's threaded workers:

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_OVERFLOW_POLICY=reject \\
    gunicorn --worker-class gthread --threads 8 examples.flask_app:app

With the limit at 2 and the ``reject`` policy, a third request while two answers are
being written is refused at once: 503 with ``Retry-After`` and an OpenAI-style JSON error
(leave the policy out and it waits for a seat, holding its thread meanwhile: give the
server more threads than the limit). ``GET /stats`` tells how many requests the app served
at once. A streamed answer holds its seat until gunicorn closes the response, after its
last chunk.

Each gunicorn worker process has a budget of its own unless ``OBLETH_REDIS_URL`` is set:
with ``--workers 4``, set it, and the four share one budget (without it, each worker logs
an error saying so).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Flask, Response, jsonify, request

from examples.pretend_model import WORD_S, Chat, InFlight, InvalidChat
from gateway.wsgi import WSGIGatewayMiddleware

app = Flask(__name__)
# the one line: settings from the OBLETH_* variables; a bad one stops the app's loading
app.wsgi_app = WSGIGatewayMiddleware(app.wsgi_app)  # type: ignore[method-assign]
in_flight = InFlight()


@app.post("/v1/chat/completions")
def chat_completions() -> Response | tuple[Response, int]:
    try:
        chat = Chat.parse_bytes(request.get_data())
    except InvalidChat as exc:
        return jsonify(exc.document()), 400
    # what the gateway decided about this request: tenant, priority, waited_s
    headers = {"x-obleth-tenant": str(request.environ["obleth"]["tenant"])}
    if chat.stream:
        return Response(_written(chat), mimetype="text/event-stream", headers=headers)
    with in_flight:
        time.sleep(chat.seconds)
    response = jsonify(chat.completion())
    response.headers.update(headers)
    return response


def _written(chat: Chat) -> Iterator[str]:
    with in_flight:
        for event in chat.events():
            time.sleep(WORD_S)
            yield event


@app.get("/stats")
def stats() -> Response:
    return jsonify(in_flight.stats())


@app.get("/healthz")
def healthz() -> str:
    """Exempt from admission (``exempt_paths``): it answers during overload."""
    return "ok"
