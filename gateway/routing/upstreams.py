"""Upstreams as configured: a base URL, and optionally the models it serves."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx

from gateway.errors import ConfigError, without_userinfo


@dataclass(frozen=True, slots=True)
class Upstream:
    """One inference server the gateway may send requests to.

    ``models`` None means it serves whatever model a request names; otherwise a request
    naming a model is only routed to upstreams whose ``models`` contain it.
    """

    url: str
    models: frozenset[str] | None = None

    def serves(self, model: str | None) -> bool:
        return model is None or self.models is None or model in self.models

    def __str__(self) -> str:
        if self.models is None:
            return self.url
        return f"{self.url}={'|'.join(sorted(self.models))}"


class UpstreamSyntaxError(ValueError):
    """An upstream entry that is not ``URL`` or ``URL=model|model``."""


def parse_upstream_entry(entry: object) -> Upstream:
    """``"http://h:8000"``, ``"http://h:8000=llama|qwen"``, an ``Upstream``, or a mapping
    ``{"url": ..., "models": [...]}``; the URL itself is checked by ``parse_upstream``."""
    if isinstance(entry, Upstream):
        return entry
    if isinstance(entry, Mapping):
        url, models = entry.get("url"), entry.get("models")
        if not isinstance(url, str):
            raise UpstreamSyntaxError(f"{dict(entry)!r} has no 'url' string")
        return Upstream(url.strip().rstrip("/"), _models(models, entry))
    if not isinstance(entry, str) or not entry.strip():
        raise UpstreamSyntaxError(f"{entry!r} is not an upstream URL")
    text = entry.strip()
    url, sep, models_text = text.partition("=")
    if not sep or "?" in url or "#" in url:
        # an '=' after a '?' or '#' is part of a query or fragment, not the start of the
        # models: the whole entry is the URL, and parse_upstream refuses it as it stands
        return Upstream(text.rstrip("/"))
    return Upstream(url.strip().rstrip("/"), _models(models_text.split("|"), entry))


def _models(models: object, entry: object) -> frozenset[str] | None:
    if models is None:
        return None
    if isinstance(models, str) or not isinstance(models, Iterable):
        raise UpstreamSyntaxError(f"{entry!r}: models must be a list of names")
    names = frozenset(str(m).strip() for m in models if str(m).strip())
    if not names:
        raise UpstreamSyntaxError(f"{entry!r} names no model after '='")
    return names


@functools.lru_cache(maxsize=256)
def parse_upstream(url: str, setting: str = "upstream") -> httpx.URL:
    """``url`` checked as an upstream base URL: http(s), a host, no query or fragment.

    The path, if any, is a prefix put in front of every forwarded path. Raises
    ``ConfigError`` naming ``setting``. Cached: routers hand the same few strings over and
    over, and parsing them on every request would be wasted work.
    """
    expected = "expected an http:// or https:// base URL, e.g. http://127.0.0.1:8000"
    if isinstance(url, str) and any(c.isspace() for c in url.strip()):
        # httpx would escape it into the host or the path, or fail on the port
        raise ConfigError(
            setting,
            without_userinfo(url),
            f"{expected}; a URL has no white space: separate upstreams with commas or newlines",
        )
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        shown = without_userinfo(url) if isinstance(url, str) else url
        raise ConfigError(setting, shown, expected) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(setting, url, expected)
    if parsed.userinfo:
        # the URL names its upstream in logs, on /metrics and in x-obleth-upstream: a
        # password in it would be shown to every client; the message masks it too
        raise ConfigError(
            setting,
            without_userinfo(url),
            f"{expected}, without a user or password (the URL is shown in logs, on /metrics "
            "and in x-obleth-upstream); a backend that wants a key gets the client's "
            "Authorization header, which the proxy forwards",
        )
    # after the password check, as this message shows the URL; a bare "?" or "#" counts
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        raise ConfigError(setting, url, f"{expected}, without a query or fragment")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ConfigError(setting, url, f"port {parsed.port} is out of range (1-65535); {expected}")
    return parsed


def server_of(url: httpx.URL | str) -> tuple[str, str, int | None, str]:
    """What two spellings of one upstream base URL share: ``http://H:80`` and
    ``http://h/`` are the same server (httpx lowers the host and drops a default port)."""
    parsed = httpx.URL(url) if isinstance(url, str) else url
    return parsed.scheme, parsed.host, parsed.port, parsed.path.rstrip("/")
