"""Model profiles: how fast one instance of a model steps, and how much KV cache it has.

A profile is data: the `gateway.sim.config.SimConfig` fields of one model on one kind of
accelerator, in a JSON file. The built-in ones are in ``gateway/simulate/profiles/``,
found by their ``model`` name (``--model``); a user's own is read from a file
(``--profile FILE``) of the same shape::

    {
      "model": "my-org/my-model",
      "about": "what it stands for, and how it was measured",
      "engine": {"step_s": 0.009, "step_s_per_seq": 0.00003, "prefill_s_per_token": 0.00004,
                 "max_num_seqs": 256, "kv_cache_blocks": 8192}
    }

``engine`` takes any `SimConfig` field; those left out keep `SimConfig`'s defaults. A
step lasts ``step_s + step_s_per_seq * sequences + prefill_s_per_token * prompt tokens
computed`` (see docs/sim.md for the whole model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from gateway.errors import ConfigError
from gateway.sim.config import SimConfig
from gateway.simulate.errors import BadFlag

MAX_PROFILE_BYTES = 64 * 1024
"""The longest profile file read: a profile is a few hundred bytes, and a path to a device
or a huge file by mistake must stop with a message, not read without end."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One model on one accelerator, as the simulation runs it."""

    model: str
    about: str
    config: SimConfig


def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped with Obleth, by model name."""
    found = {}
    for entry in sorted(resources.files(__package__).joinpath("profiles").iterdir(), key=str):
        if entry.name.endswith(".json"):
            profile = _parse(json.loads(entry.read_text("utf-8")), f"built-in {entry.name}")
            found[profile.model] = profile
    return found


def named(model: str) -> Profile:
    """The built-in profile of ``model`` (case does not matter); `BadFlag` listing the
    others when there is none."""
    profiles = builtin_profiles()
    for name, profile in profiles.items():
        if name.lower() == model.strip().lower():
            return profile
    raise BadFlag(
        "--model",
        model,
        f"one of the built-in profiles: {', '.join(profiles)} "
        "(or give your own with --profile FILE)",
    )


def from_file(path: str) -> Profile:
    """The profile in the JSON file at ``path``; `BadFlag` naming ``--profile`` and what is
    wrong with it."""
    if not path:
        raise BadFlag("--profile", path, "the name of a JSON file")
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise BadFlag("--profile", path, f"a readable file ({exc.strerror})") from None
    if len(text) > MAX_PROFILE_BYTES:
        longest = f"a profile of at most {MAX_PROFILE_BYTES // 1024} KiB (it is longer)"
        raise BadFlag("--profile", path, longest)
    try:
        data = json.loads(text.decode("utf-8"))
    except ValueError as exc:
        raise BadFlag("--profile", path, f"a JSON file ({exc})") from None
    except RecursionError:  # a few hundred "[" are enough
        nested = "a JSON file (it nests deeper than Python reads)"
        raise BadFlag("--profile", path, nested) from None
    return _parse(data, path)


def _parse(data: Any, where: str) -> Profile:
    accepted = [f.name for f in fields(SimConfig) if f.name != "model"]
    shape = 'a JSON object {"model": NAME, "about": TEXT, "engine": {FIELD: VALUE, ...}}'
    if not isinstance(data, dict) or not isinstance(data.get("engine", {}), dict):
        raise BadFlag("--profile", where, shape)
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise BadFlag("--profile", where, shape + ' with a non-empty "model"')
    unknown = sorted(set(data) - {"model", "about", "engine"})
    engine = data.get("engine", {})
    unknown += sorted(f"engine.{k}" for k in set(engine) - set(accepted))
    if unknown:
        raise BadFlag(
            "--profile",
            where,
            f"only model, about and engine.FIELD keys; unknown: {', '.join(unknown)}; "
            f"engine fields: {', '.join(accepted)}",
        )
    try:
        config = SimConfig(model=model, **engine)
    except ConfigError as exc:
        raise BadFlag("--profile", where, f"usable engine values: {exc}") from None
    return Profile(model=model, about=str(data.get("about", "")), config=config)
