"""The demo's tenants: who sends, how hard, with which weight and priority mix."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.tickets import MAX_TENANT_CHARS
from gateway.errors import ConfigError


@dataclass(frozen=True)
class TenantLoad:
    """One tenant of the demo: ``clients`` concurrent clients sending back to back."""

    name: str
    weight: float
    clients: int
    critical_share: float = 0.0
    background_share: float = 0.0


def parse_tenants(text: str, *, limit: int, flood: str | None) -> list[TenantLoad]:
    """``gold:4,silver:2,bronze:1`` into tenant loads.

    Every tenant gets ``limit`` clients (enough to be backlogged on its own); the flooding
    tenant gets three times as many. The first tenant sends 10 % ``critical`` requests,
    the second 25 % ``background`` ones, so every class shows up in the table.
    """
    tenants: list[TenantLoad] = []
    for index, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        name, _, weight_text = part.partition(":")
        try:
            weight = float(weight_text or "1")
        except ValueError:
            raise ConfigError(
                "--tenants", text, "expected name:weight pairs like gold:4,free:1"
            ) from None
        name = name.strip()
        if not name or not 0 < weight < float("inf"):
            raise ConfigError("--tenants", text, "expected name:weight pairs with weights above 0")
        if len(name) > MAX_TENANT_CHARS:
            raise ConfigError(
                "--tenants",
                text,
                f"tenant {name[:20]!r}...: names are at most {MAX_TENANT_CHARS} characters, as "
                "the gateway takes them",
            )
        if not name.isascii() or not name.isprintable():
            raise ConfigError(
                "--tenants", text, f"tenant {name!r}: names are sent as a header, so ASCII only"
            )
        if name in {t.name for t in tenants}:
            raise ConfigError("--tenants", text, f"tenant {name!r} is named twice")
        tenants.append(
            TenantLoad(
                name=name,
                weight=weight,
                clients=limit * (3 if name == flood else 1),
                critical_share=0.1 if index == 0 else 0.0,
                background_share=0.25 if index == 1 else 0.0,
            )
        )
    if not tenants:
        raise ConfigError("--tenants", text, "expected at least one tenant, e.g. gold:4,free:1")
    if flood is not None and flood not in {t.name for t in tenants}:
        raise ConfigError("--flood", flood, f"expected one of {', '.join(t.name for t in tenants)}")
    return tenants
