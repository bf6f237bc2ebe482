"""``name:weight`` parsing, shared by tenant weights and (later) routing scorers."""

from __future__ import annotations

import pytest

from gateway.core.weights import WeightSyntaxError, format_weights, parse_weights


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gold:4,free:1", {"gold": 4.0, "free": 1.0}),
        (" gold : 4 , free:0.5 ", {"gold": 4.0, "free": 0.5}),
        ("", {}),
        ("a:1,,b:2,", {"a": 1.0, "b": 2.0}),
        ("prefix-affinity:5,queue-depth:1", {"prefix-affinity": 5.0, "queue-depth": 1.0}),
    ],
)
def test_weight_lists_parse_to_floats(text: str, expected: dict[str, float]) -> None:
    """Well-formed lists parse, whitespace and empty parts ignored."""
    assert parse_weights(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("gold:x", "not a number"),
        ("gold:0", "greater than 0"),
        ("gold:-1", "greater than 0"),
        ("gold:inf", "finite"),
        ("gold:nan", "finite"),
        ("gold", "no ':weight'"),
        # the hint must be one that parses as meant: "gold=4:1" would name a tenant "gold=4"
        ("gold=4,free=1", r"write gold:4; the separator is ':', not '='"),
        (":3", "no name"),
        ("a:1,a:2", "twice"),
    ],
)
def test_malformed_weight_lists_say_which_part_is_wrong(text: str, complaint: str) -> None:
    """Each malformed list is refused with a message pointing at the bad part."""
    with pytest.raises(WeightSyntaxError, match=complaint):
        parse_weights(text)


def test_bare_names_weigh_one_when_allowed() -> None:
    """With allow_bare, ``round-robin`` means weight 1."""
    assert parse_weights("round-robin", allow_bare=True) == {"round-robin": 1.0}


def test_formatting_round_trips() -> None:
    """What is formatted parses back to the same weights."""
    weights = {"gold": 4.0, "free": 0.25}
    assert parse_weights(format_weights(weights.items())) == weights
