"""Parsers of ``OBLETH_*`` text: each turns a variable's text into a value for its check.

A parser is called as ``parse(key, text)`` with the variable's name, and raises
``ConfigError`` naming ``key`` when the text cannot be read at all. Whether the value is
acceptable (a limit of at least 1, a known scheme) is the check's to say, for keywords and
variables alike (see ``gateway.settings.checks``).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.weights import WeightSyntaxError, parse_pairs, parse_weights
from gateway.errors import ConfigError

SCORERS_EXPECTED = "expected scorer:weight pairs like prefix-affinity:5,queue-depth:1"


def env_int(key: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(key, text, "expected a whole number, e.g. 64") from None


def env_optional_int(key: str, text: str) -> int | None:
    return env_int(key, text) if text.strip() else None


def _env_number(expected: str) -> Callable[[str, str], float]:
    """A parser of one number whose error says what was ``expected``."""

    def parse(key: str, text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            raise ConfigError(key, text, expected) from None

    return parse


env_float = _env_number("expected a number of seconds, e.g. 30 or 0.5")
env_weight = _env_number("expected a weight, a number above 0, e.g. 1 or 2.5")
env_multiple = _env_number("expected a number, e.g. 1.5")


def env_optional_float(key: str, text: str) -> float | None:
    return env_float(key, text) if text.strip() else None


def env_bool(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(key, text, "expected true or false")


def env_text(key: str, text: str) -> str:
    return text.strip()


def env_optional_text(key: str, text: str) -> str | None:
    return text.strip() or None


def env_list(key: str, text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def env_upstreams(key: str, text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.replace("\n", ",").split(",") if part.strip())


def _env_pairs(expected: str) -> Callable[[str, str], dict[str, float]]:
    """A parser of ``name:weight,...`` whose error says what was ``expected``."""

    def parse(key: str, text: str) -> dict[str, float]:
        try:
            return parse_weights(text)
        except WeightSyntaxError as exc:
            raise ConfigError(key, text, f"{exc}; {expected}") from None

    return parse


env_weights = _env_pairs("expected tenant:weight pairs like gold:4,free:1")
env_scorers = _env_pairs(SCORERS_EXPECTED)


def _env_per_tenant(noun: str, example: str) -> Callable[[str, str], int | dict[str, int] | None]:
    """The parser of a whole number per tenant, a ``noun`` (a cap, a budget): ``16`` (every
    tenant) or ``example``'s form, ``free:4,*:16``; the values are checked by
    ``checks.check_caps`` or ``checks.check_budgets``."""
    expected = f"expected a whole number (for every tenant), or tenant:{noun} pairs like {example}"

    def whole(name: str, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise WeightSyntaxError(f"{name}: {noun} {text!r} is not a whole number") from None

    def parse(key: str, text: str) -> int | dict[str, int] | None:
        text = text.strip()
        if not text:
            return None
        if ":" not in text:
            try:
                return int(text)
            except ValueError:
                raise ConfigError(key, text, expected) from None
        try:
            return parse_pairs(text, whole, what=noun)
        except WeightSyntaxError as exc:
            raise ConfigError(key, text, f"{exc}; {expected}") from None

    return parse


env_caps = _env_per_tenant("cap", "free:4,*:16")
env_budgets = _env_per_tenant("budget", "free:60,*:600")


#: The parsers for which a blank variable means something (None: no limit, no header,
#: no cap); for every other setting a blank variable is unset (see ``read_environ``).
READS_BLANK = frozenset(
    {env_optional_int, env_optional_float, env_optional_text, env_caps, env_budgets}
)
