"""SimConfig: defaults that work, and bad values stopped with the setting named."""

from __future__ import annotations

import math

import pytest

from gateway.errors import ConfigError
from gateway.sim import SimConfig


def test_defaults_describe_a_small_gpu_server() -> None:
    """The defaults construct and keep their documented values."""
    config = SimConfig()
    assert config.max_num_seqs == 32
    assert config.step_s == pytest.approx(0.010)
    assert config.step_s_per_seq == pytest.approx(0.0002)
    assert config.prefill_s_per_token == pytest.approx(0.0002)


def test_chunked_prefill_is_off_unless_a_token_budget_is_set() -> None:
    """max_num_batched_tokens defaults to None; any budget >= max_num_seqs is accepted."""
    assert SimConfig().max_num_batched_tokens is None
    assert SimConfig(max_num_seqs=4, max_num_batched_tokens=4).max_num_batched_tokens == 4


def test_zero_prefix_cache_blocks_is_allowed_to_disable_caching() -> None:
    """A cache-less baseline is a valid configuration."""
    assert SimConfig(prefix_cache_blocks=0).prefix_cache_blocks == 0


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("model", ""),
        ("model", "   "),
        ("max_num_seqs", 0),
        ("max_num_seqs", True),
        ("max_num_seqs", 2.5),
        ("block_size_tokens", 0),
        ("chars_per_token", -1),
        # each token is text of this many characters: 10**20 used to crash the engine loop
        ("chars_per_token", 101),
        ("chars_per_token", 10**20),
        ("prefix_cache_blocks", -1),
        ("kv_cache_blocks", 0),
        ("default_max_tokens", 0),
        ("step_s", -0.001),
        ("step_s_per_seq", math.inf),
        ("prefill_s_per_token", math.nan),
        ("step_s", 10**400),
        ("prefill_s_per_token", "0.1"),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 31),
        ("max_num_batched_tokens", 64.0),
    ],
)
def test_bad_values_raise_config_error_naming_the_setting(setting: str, value: object) -> None:
    """Each unusable value stops construction with a ConfigError that names its field."""
    with pytest.raises(ConfigError) as caught:
        SimConfig(**{setting: value})  # type: ignore[arg-type]
    assert caught.value.setting == setting
    assert setting in str(caught.value)


def test_config_is_immutable() -> None:
    """A config can be shared between an engine and an app without copies."""
    config = SimConfig()
    with pytest.raises(AttributeError):
        config.max_num_seqs = 4  # type: ignore[misc]
