"""`obleth mock-backend`: serve the simulated inference backend (gateway.sim) with uvicorn."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import uvicorn

from gateway.asgi.lifespan import STARTUP_FAILURE
from gateway.cli.defaults import DefaultsShown
from gateway.cli.server_flags import GRACEFUL_S, add_server_flags, cannot_listen
from gateway.errors import ConfigError
from gateway.server.running import Server, serve
from gateway.server.workers import listening_socket
from gateway.sim import SimConfig, create_app
from gateway.sim.config import MAX_DURATION_S


@dataclass(frozen=True, slots=True)
class _Knob:
    """One command-line flag standing for one SimConfig field."""

    field: str
    flag: str
    type: type[int] | type[float] | type[str]
    help: str
    scale: float = 1.0
    """Multiplier from the flag's unit to the field's (milliseconds to seconds: 0.001)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


_MS = 0.001
_DEFAULTS = SimConfig()
_KNOBS = (
    _Knob("model", "--model", str, "model name served and used as the model_name label"),
    _Knob("max_num_seqs", "--max-num-seqs", int, "continuous-batching slots (sequences)"),
    _Knob("block_size_tokens", "--block-size-tokens", int, "tokens per KV-cache block"),
    _Knob("chars_per_token", "--chars-per-token", int, "prompt characters per token"),
    _Knob("prefix_cache_blocks", "--prefix-cache-blocks", int, "prefix cache capacity, 0 disables"),
    _Knob(
        "kv_cache_blocks",
        "--kv-cache-blocks",
        int,
        "KV cache blocks: new requests wait for room, a full cache preempts",
    ),
    _Knob(
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
        int,
        "tokens per step shared by decodes and prefill chunks, for chunked prefill (default: off)",
    ),
    _Knob(
        "prefill_s_per_token",
        "--prefill-ms-per-token",
        float,
        "milliseconds of prefill per prompt token missing the prefix cache",
        _MS,
    ),
    _Knob("step_s", "--step-ms", float, "milliseconds of the base decode step", _MS),
    _Knob(
        "step_s_per_seq",
        "--step-ms-per-seq",
        float,
        "milliseconds added to a step per running sequence",
        _MS,
    ),
    _Knob(
        "default_max_tokens",
        "--default-max-tokens",
        int,
        "completion tokens when a request sets no max_tokens",
    ),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `mock-backend` command."""
    parser = sub.add_parser(
        "mock-backend",
        help="serve a simulated OpenAI-compatible inference backend",
        description=(
            "Serve a simulated vLLM-like backend: continuous batching, a prefix cache, "
            "OpenAI completions and chat endpoints, vLLM metrics. See docs/sim.md."
        ),
        formatter_class=DefaultsShown,
    )
    add_server_flags(parser, port=8001)
    for knob in _KNOBS:
        default = getattr(_DEFAULTS, knob.field)
        if knob.scale != 1.0:
            # Show 0.2 rather than 0.19999999999999998.
            default = round(default / knob.scale, 9)
        parser.add_argument(knob.flag, type=knob.type, default=default, help=knob.help)
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The SimConfig the flags describe; a bad value raises ConfigError naming its flag."""
    values: dict[str, Any] = {}
    for knob in _KNOBS:
        value = getattr(args, knob.dest)
        values[knob.field] = value * knob.scale if knob.scale != 1.0 else value
    try:
        return SimConfig(**values)
    except ConfigError as exc:
        knob = next(k for k in _KNOBS if k.field == exc.setting)
        expected = exc.expected
        if knob.scale != 1.0:  # a duration, which the flag gives in milliseconds
            expected = f"must be a number of milliseconds from 0 to {MAX_DURATION_S / knob.scale:g}"
        raise ConfigError(knob.flag, getattr(args, knob.dest), expected) from None


def run(args: argparse.Namespace) -> int:
    """Serve the simulator until SIGINT or SIGTERM (then 0); 3 when it cannot listen or
    its startup fails, after one line naming the cause."""
    app = create_app(config_from_args(args))
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as exc:
        print(cannot_listen("mock-backend", args.host, args.port, "--port", exc), file=sys.stderr)
        return STARTUP_FAILURE
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=args.access_log,
        lifespan="on",
        # a signal lets the streams under way end, for as long as obleth serve lets its own
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    server = Server(config)
    try:
        serve([server], [sock])
    finally:
        sock.close()
    return 0 if server.started else STARTUP_FAILURE
