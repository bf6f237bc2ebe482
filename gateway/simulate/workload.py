"""The requests of a simulation: Poisson arrivals, token counts, shared prefixes, tenants.

Everything is drawn from one seeded generator in a fixed order, so a seed names one
workload exactly; changing the number of instances or the routing leaves it unchanged,
which is what makes two configurations comparable.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.simulate.errors import BadFlag
from gateway.simulate.numbers import number

#: Characters per token of the simulated tokenizer (`gateway.sim.tokens`).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Tokens:
    """A token count: fixed, or drawn from a distribution (see `parse_tokens`)."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> int:
        """One count, from 1 to ``MAX_TOKENS``: a distribution's tail is cut there, as the
        bound of a fixed count is (``exponential:1e7`` draws above it)."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:  # exponential, of mean a
            value = rng.expovariate(1.0 / self.a)
        return min(MAX_TOKENS, max(1, round(value)))

    @property
    def mean(self) -> float:
        """The distribution's mean, before rounding and the floor at 1."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "exponential":
            return f"exponential:{number(self.a)}"
        return f"{self.kind}:{number(self.a)},{number(self.b)}"


MAX_TOKENS = 10_000_000
"""The most tokens a prompt or a reply may be drawn with (or a shared prefix be): beyond
any model's context, and the prompt's text is built in memory."""


MAX_REQUESTS = 1_000_000
"""The most requests a simulation runs: each is drawn before the run and kept for the
report (about 3 KB each; a million takes minutes and gigabytes)."""


MAX_PROMPT_TOKENS = 250_000_000
"""The most tokens the prompts of a run may add up to (a shared prefix counted in each
prompt that starts with it): their text is built before the run, about 1 GB at most."""


MAX_GROUPS = 100_000
"""The most shared-prefix groups: each group's prefix text is built before the run."""


def parse_tokens(flag: str, text: str) -> Tokens:
    """``512`` (fixed), ``uniform:LOW,HIGH``, ``normal:MEAN,STDEV`` or ``exponential:MEAN``;
    `BadFlag` naming ``flag`` for anything else."""
    usage = (
        "a whole number like 512, or uniform:LOW,HIGH, normal:MEAN,STDEV, exponential:MEAN "
        f"(counts from 1 to {MAX_TOKENS}, LOW <= HIGH, STDEV >= 0)"
    )
    kind, _, args = text.strip().partition(":")
    try:
        if not args:
            value = int(kind)
            if not 1 <= value <= MAX_TOKENS:
                raise ValueError
            return Tokens("fixed", value)
        numbers = [float(n) for n in args.split(",")]
        if not all(math.isfinite(n) and n <= MAX_TOKENS for n in numbers):
            raise ValueError
    except ValueError:
        raise BadFlag(flag, text, usage) from None
    if kind == "exponential" and len(numbers) == 1 and numbers[0] >= 1:
        return Tokens("exponential", numbers[0])
    if kind == "uniform" and len(numbers) == 2 and 1 <= numbers[0] <= numbers[1]:
        return Tokens("uniform", numbers[0], numbers[1])
    if kind == "normal" and len(numbers) == 2 and numbers[0] >= 1 and numbers[1] >= 0:
        return Tokens("normal", numbers[0], numbers[1])
    raise BadFlag(flag, text, usage)


def parse_shares(flag: str, text: str) -> dict[str, float]:
    """``name:share,name:share``: tenants and their shares of the traffic (> 0)."""
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition(":")
        try:
            share = float(value) if sep else 1.0
        except ValueError:
            share = -1.0
        if (
            not name
            or not name.isprintable()
            or not math.isfinite(share)
            or share <= 0
            or name in shares
        ):
            raise BadFlag(flag, text, "name:share pairs with shares > 0, each name once")
        shares[name] = share
    if not math.isfinite(sum(shares.values())):
        raise BadFlag(flag, text, "name:share pairs whose shares add up to a finite number")
    return shares


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of the workload."""

    index: int
    arrival_s: float
    """Seconds after the start of the run."""
    tenant: str
    prompt: str
    prompt_tokens: int
    output_tokens: int
    group: int | None
    """The shared prefix it starts with, if any."""

    def body(self, model: str) -> bytes:
        """The OpenAI-style completions body a client would send."""
        payload = {"model": model, "prompt": self.prompt, "max_tokens": self.output_tokens}
        return json.dumps(payload, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Workload:
    """How to draw the requests of a run."""

    rate: float
    """Requests per second arriving at the gateway, in all (Poisson)."""
    num_requests: int
    input_tokens: Tokens
    output_tokens: Tokens
    prefix_tokens: int = 0
    """Tokens of shared prefix before each prompt's own input tokens."""
    prefix_groups: int = 1
    """How many different shared prefixes there are; each request draws one."""
    tenants: Mapping[str, float] | None = None
    """Tenants and their shares of the traffic; one tenant, ``default``, when None."""

    def requests(self, seed: int) -> list[SimRequest]:
        """The requests, in arrival order; the same for the same seed."""
        rng = random.Random(seed)  # noqa: S311 -- a simulation's workload, not secrecy
        tenants = dict(self.tenants) if self.tenants else {"default": 1.0}
        names = list(tenants)
        weights = [tenants[n] for n in names]
        drawn = []
        now = 0.0
        for _ in range(self.num_requests):  # drawn first: the texts are built once checked
            now += rng.expovariate(self.rate)
            tenant = rng.choices(names, weights)[0] if len(names) > 1 else names[0]
            own = self.input_tokens.draw(rng)
            output = self.output_tokens.draw(rng)
            group = rng.randrange(self.prefix_groups) if self.prefix_tokens else None
            drawn.append((now, tenant, own, output, group))
        total = sum(self.prefix_tokens + own for _, _, own, _, _ in drawn)
        if total > MAX_PROMPT_TOKENS:
            raise BadFlag(
                "--num-requests",
                self.num_requests,
                f"prompts that add up to at most {MAX_PROMPT_TOKENS:,} tokens (their text "
                f"is built before the run, {CHARS_PER_TOKEN} characters a token); these add "
                f"up to {total:.3g}: fewer requests, or shorter --input-tokens or "
                "--prefix-tokens",
                told=True,
            )
        used = sorted({group for *_, group in drawn if group is not None})
        prefixes = {g: _text(f"prefix {seed}-{g}", self.prefix_tokens) for g in used}
        return [
            SimRequest(
                index=index,
                arrival_s=arrival,
                tenant=tenant,
                prompt=(prefixes[group] if group is not None else "")
                + _text(f"request {seed}-{index}", own),
                prompt_tokens=self.prefix_tokens + own,
                output_tokens=output,
                group=group,
            )
            for index, (arrival, tenant, own, output, group) in enumerate(drawn)
        ]


def _text(label: str, tokens: int) -> str:
    """``tokens`` tokens of text that no other label's text shares a block with."""
    if tokens <= 0:
        return ""
    chars = tokens * CHARS_PER_TOKEN
    unit = f"<{label}>"
    return (unit * (chars // len(unit) + 1))[:chars]
