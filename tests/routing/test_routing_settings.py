"""Routing settings: every mistake stops startup with the setting's name and what it accepts."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import ConfigError, Gateway, Settings
from gateway.routing.upstreams import Upstream

A, B = "http://vllm-a:8000", "http://vllm-b:8000"
INSTALLED_SCORERS = [
    "kv-utilization",
    "load-balance",
    "prefix-affinity",
    "queue-depth",
    "session-affinity",
]


def test_default_scorers_are_prefix_affinity_5_and_queue_depth_1() -> None:
    """Out of the box the weighted policy is prefix-affinity:5,queue-depth:1, in that order."""
    settings = Settings()
    assert settings.routing_policy == "weighted"
    assert list(settings.routing_scorers.items()) == [
        ("prefix-affinity", 5.0),
        ("queue-depth", 1.0),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("queue-depth:1", {"queue-depth": 1.0}),
        (" kv-utilization : 2 , load-balance:0.5 ", {"kv-utilization": 2.0, "load-balance": 0.5}),
        (
            {"session-affinity": 3, "queue-depth": 1.5},
            {"session-affinity": 3.0, "queue-depth": 1.5},
        ),
    ],
    ids=["text", "spaces", "mapping"],
)
def test_routing_scorers_accept_text_and_mappings(value: Any, expected: dict[str, float]) -> None:
    """``routing_scorers`` takes ``name:weight`` text or a mapping; weights become floats."""
    assert dict(Settings(routing_scorers=value).routing_scorers) == expected


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("prefix-affinity:5,prefix-affinity:1", "given twice"),
        ("queue-depth:x", "not a number"),
        ("queue-depth:inf", "finite"),
        ("queue-depth:nan", "finite"),
        ("queue-depth:0", "greater than 0"),
        ("queue-depth:-1", "greater than 0"),
        ("queue-depth", "no ':weight'"),
        ("prefix-affinity:5,queue-depth", "no ':weight'"),
        ("", "no scorer given"),
        (" , ", "no scorer given"),
        ({}, "no scorer given"),
        ({"queue-depth": 0}, "greater than 0"),
        ({"queue-depth": float("inf")}, "finite"),
        ({"queue-depth": float("nan")}, "finite"),
        ({"queue-depth": "x"}, "not a number"),
        ({"queue-depth": True}, "not a number"),
        (42, "scorer:weight pairs"),
    ],
    ids=[
        "duplicate",
        "weight-x",
        "inf",
        "nan",
        "zero",
        "negative",
        "missing-weight",
        "missing-second-weight",
        "empty",
        "only-commas",
        "empty-mapping",
        "mapping-zero",
        "mapping-inf",
        "mapping-nan",
        "mapping-text",
        "mapping-bool",
        "not-text",
    ],
)
def test_bad_routing_scorers_are_refused_naming_the_setting(value: Any, complaint: str) -> None:
    """A malformed scorer list names ``routing_scorers``, the bad part, and an example."""
    with pytest.raises(ConfigError) as caught:
        Settings(routing_scorers=value)
    message = str(caught.value)
    assert caught.value.setting == "routing_scorers"
    assert message.startswith("routing_scorers=")
    assert complaint in message
    assert "prefix-affinity:5,queue-depth:1" in message


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("queue-depth:1,queue-depth:2", "given twice"),
        ("queue-depth:x", "not a number"),
        ("queue-depth:inf", "finite"),
        ("queue-depth:nan", "finite"),
        ("queue-depth:0", "greater than 0"),
        ("queue-depth:-1", "greater than 0"),
        ("queue-depth", "no ':weight'"),
        (" , ", "no scorer given"),  # a blank variable is unset: the default scorers
    ],
)
def test_bad_obleth_routing_scorers_names_the_variable(text: str, complaint: str) -> None:
    """From the environment the error names ``OBLETH_ROUTING_SCORERS``, as the user wrote it."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_ROUTING_SCORERS": text})
    assert caught.value.setting == "OBLETH_ROUTING_SCORERS"
    assert str(caught.value).startswith("OBLETH_ROUTING_SCORERS=")
    assert complaint in str(caught.value)


def test_obleth_routing_scorers_reads_a_comma_list() -> None:
    """``OBLETH_ROUTING_SCORERS=a:1,b:2`` keeps the names, their weights and their order."""
    settings = Settings.from_env(
        {"OBLETH_ROUTING_SCORERS": "session-affinity:3, kv-utilization:1.5,queue-depth:1"}
    )
    assert list(settings.routing_scorers.items()) == [
        ("session-affinity", 3.0),
        ("kv-utilization", 1.5),
        ("queue-depth", 1.0),
    ]


@pytest.mark.parametrize("policy", ["weighted", "round-robin", "least-loaded"])
@pytest.mark.parametrize(
    ("source", "label"),
    [("code", "routing_scorers"), ("env", "OBLETH_ROUTING_SCORERS")],
)
def test_an_unknown_scorer_stops_gateway_assembly_listing_the_installed_ones(
    source: str, label: str, policy: str
) -> None:
    """A scorer name no plugin offers stops startup, under the policies that do not use
    the scorers too (docs/routing.md); the message lists what is installed."""
    if source == "env":
        settings = Settings.from_env(
            {
                "OBLETH_UPSTREAMS": A,
                "OBLETH_ROUTING_SCORERS": "prefix-afinity:5,queue-depth:1",
                "OBLETH_ROUTING_POLICY": policy,
            }
        )
    else:
        settings = Settings(
            upstreams=[A],
            routing_scorers="prefix-afinity:5,queue-depth:1",
            routing_policy=policy,  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError) as caught:
        Gateway(settings, entry_points=False)
    message = str(caught.value)
    assert caught.value.setting == label
    assert message.startswith(f"{label}='prefix-afinity'")
    assert "installed:" in message
    for name in INSTALLED_SCORERS:
        assert name in message


def test_installed_scorers_assemble_into_a_router() -> None:
    """Every built-in scorer name is accepted at assembly."""
    scorers = ",".join(f"{name}:1" for name in INSTALLED_SCORERS)
    gateway = Gateway(Settings(upstreams=[A], routing_scorers=scorers), entry_points=False)
    assert gateway.router is not None


# -- upstreams ----------------------------------------------------------------------------------


def test_obleth_upstreams_reads_urls_and_their_models() -> None:
    """``OBLETH_UPSTREAMS``: comma-separated base URLs, each optionally ``=model|model``."""
    settings = Settings.from_env(
        {"OBLETH_UPSTREAMS": f"{A}=llama-3|qwen , {B}/,http://vllm-c:8000/v1=mistral"}
    )
    assert settings.upstreams == (
        Upstream(A, frozenset({"llama-3", "qwen"})),
        Upstream(B),
        Upstream("http://vllm-c:8000/v1", frozenset({"mistral"})),
    )


def test_upstreams_in_code_take_text_and_mappings() -> None:
    """In code, upstreams are entries like the environment's, mappings, or ``Upstream``s."""
    settings = Settings(
        upstreams=[f"{A}=llama", {"url": B, "models": ["qwen", "llama"]}, Upstream("https://c")]
    )
    assert settings.upstreams == (
        Upstream(A, frozenset({"llama"})),
        Upstream(B, frozenset({"qwen", "llama"})),
        Upstream("https://c"),
    )
    assert Upstream(A).serves("anything")
    assert settings.upstreams[0].serves("llama")
    assert not settings.upstreams[0].serves("qwen")


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ("ftp://vllm-a:8000", "http:// or https://"),
        ("http://", "http:// or https://"),
        ("vllm-a:8000", "http:// or https://"),
        ("http://vllm-a:8000/?debug", "without a query"),
        ("http://vllm-a:8000/v1#top", "without a query or fragment"),
        ("http://vllm-a:99999", "port 99999 is out of range (1-65535)"),
        ("http://vllm-a:0", "port 0 is out of range"),
        (f"{A}=", "names no model"),
        (f"{A}= | ", "names no model"),
        ({"models": ["llama"]}, "no 'url'"),
        (42, "not an upstream URL"),
        ("  ", "not an upstream URL"),
        ("http://vllm-b:8000 http://vllm-c:8000", "separate upstreams with commas"),
        ("http://vllm-b:8000/ http://vllm-c:8000", "separate upstreams with commas"),
    ],
    ids=[
        "ftp",
        "no-host",
        "no-scheme",
        "query",
        "fragment",
        "port-too-high",
        "port-zero",
        "empty-models",
        "blank-models",
        "mapping-no-url",
        "number",
        "blank",
        "two-in-one-space",
        "two-in-one-path",
    ],
)
def test_bad_upstreams_are_refused_naming_the_setting(entry: Any, complaint: str) -> None:
    """A bad upstream entry names ``upstreams`` and says what an upstream looks like."""
    with pytest.raises(ConfigError) as caught:
        Settings(upstreams=[A, entry])
    assert caught.value.setting == "upstreams"
    assert str(caught.value).startswith("upstreams=")
    assert complaint in str(caught.value)


@pytest.mark.parametrize(
    "entry", ["http://h?y=1", "http://h#a=b", "http://h/v1?a=b=llama", "http://h?"]
)
def test_an_upstream_with_a_query_is_refused_as_the_user_wrote_it(entry: str) -> None:
    """An ``=`` inside a query or fragment does not start the models: the message shows
    the whole entry, not a URL cut at that ``=``, and says a query is not allowed."""
    for settings in (
        lambda: Settings(upstreams=[entry]),
        lambda: Settings.from_env({"OBLETH_UPSTREAMS": entry}),
    ):
        with pytest.raises(ConfigError) as caught:
            settings()
        assert str(caught.value).split("=", 1)[1].startswith(f"{entry!r}: ")
        assert str(caught.value).endswith("without a query or fragment")


def test_models_still_follow_the_first_equals_sign_of_a_plain_url() -> None:
    """``URL=model|model`` is unchanged by the query rule."""
    [upstream] = Settings(upstreams=["http://h:8000=llama|qwen"]).upstreams
    assert upstream == Upstream("http://h:8000", frozenset({"llama", "qwen"}))


@pytest.mark.parametrize("entry", ["http://u:s3cret@h?y=1", "http://u:s3cret@h#a=b"])
def test_an_upstream_with_a_query_and_a_password_hides_the_password(entry: str) -> None:
    """Whatever else is wrong with the URL, the password never reaches the message."""
    with pytest.raises(ConfigError) as caught:
        Settings(upstreams=[entry])
    assert "s3cret" not in str(caught.value) and "without a user or password" in str(caught.value)


@pytest.mark.parametrize(
    "entry",
    [
        "http://user:s3cret@vllm-a:8000",
        "http://s3cret@vllm-a:8000",
        "http://user:s3@cret@vllm-a:8000",
    ],
)
def test_an_upstream_with_credentials_is_refused_without_showing_them(entry: str) -> None:
    """An upstream's URL is shown in logs, on ``/metrics`` and in ``x-obleth-upstream``: a
    user or password in it would reach every client. The error masks them too."""
    with pytest.raises(ConfigError) as caught:
        Settings(upstreams=[entry])
    assert "without a user or password" in str(caught.value)
    message = str(caught.value)
    assert "s3cret" not in message and "cret" not in message  # an "@" in it too
    assert "http://***@vllm-a:8000" in message


def test_an_upstream_that_does_not_parse_is_refused_without_showing_its_password() -> None:
    """A URL httpx cannot read (an unclosed IPv6 bracket) is refused as no URL; the
    message still masks its user part (it used to print it whole)."""
    with pytest.raises(ConfigError) as caught:
        Settings(upstreams=["http://user:s3cret@[::1"])
    assert "s3cret" not in str(caught.value) and "http://***@[::1" in str(caught.value)


@pytest.mark.parametrize(
    "text", ["ftp://vllm-a:8000", "http://", f"{A},http://b:1/?q=1", f"{A} http://b:1"]
)
def test_bad_obleth_upstreams_names_the_variable(text: str) -> None:
    """From the environment the error names ``OBLETH_UPSTREAMS``."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_UPSTREAMS": text})
    assert caught.value.setting == "OBLETH_UPSTREAMS"
    assert "http://" in str(caught.value)


@pytest.mark.parametrize(
    "upstreams",
    [
        [A, A],
        [A, f"{A}/"],
        [f"{A}=llama", f"{A}=qwen"],
        f"{B},{A},{B}",
        ["http://vllm-x:80", "http://VLLM-X"],  # one server: the default port, any case
        ["https://vllm-x/v1", "https://vllm-x:443/v1/"],
    ],
    ids=[
        "same",
        "trailing-slash",
        "different-models",
        "env-style-text",
        "default-port-and-case",
        "https-default-port",
    ],
)
def test_an_upstream_listed_twice_is_refused(upstreams: Any) -> None:
    """The same base URL twice is a mistake (two entries for one server), named as such."""
    with pytest.raises(ConfigError, match="listed twice") as caught:
        Settings(upstreams=upstreams)
    assert caught.value.setting == "upstreams"


# -- policy, load bound, session header ---------------------------------------------------------


@pytest.mark.parametrize("policy", ["weighted", "round-robin", "least-loaded"])
def test_known_routing_policies_are_accepted(policy: str) -> None:
    """The three policies are spelled as documented."""
    assert Settings(routing_policy=policy).routing_policy == policy  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["random", "round_robin", "Weighted", "", None])
def test_an_unknown_routing_policy_is_refused_listing_the_known_ones(policy: Any) -> None:
    """An unknown policy names ``routing_policy`` and the three that exist."""
    with pytest.raises(ConfigError) as caught:
        Settings(routing_policy=policy)
    message = str(caught.value)
    assert caught.value.setting == "routing_policy"
    for known in ("weighted", "round-robin", "least-loaded"):
        assert known in message


def test_an_unknown_obleth_routing_policy_names_the_variable() -> None:
    """From the environment the error names ``OBLETH_ROUTING_POLICY``."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_ROUTING_POLICY": "fastest"})
    assert caught.value.setting == "OBLETH_ROUTING_POLICY"
    assert "round-robin" in str(caught.value)


@pytest.mark.parametrize("bound", [1, 1.0, 1.5, 10])
def test_a_load_bound_of_at_least_one_is_accepted(bound: float) -> None:
    """``routing_load_bound`` is a multiple of the average, 1 or more."""
    assert Settings(routing_load_bound=bound).routing_load_bound == float(bound)


@pytest.mark.parametrize("bound", [0.99, 0.5, 0, -1, float("inf"), float("nan"), True, "2"])
def test_a_load_bound_below_one_or_not_finite_is_refused(bound: Any) -> None:
    """A bound below 1 would pass over every upstream; it names the setting and the range."""
    with pytest.raises(ConfigError) as caught:
        Settings(routing_load_bound=bound)
    assert caught.value.setting == "routing_load_bound"
    assert "at least 1" in str(caught.value)


@pytest.mark.parametrize(("text", "complaint"), [("0.5", "at least 1"), ("x", "number")])
def test_a_bad_obleth_routing_load_bound_names_the_variable(text: str, complaint: str) -> None:
    """From the environment the error names ``OBLETH_ROUTING_LOAD_BOUND``."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_ROUTING_LOAD_BOUND": text})
    assert caught.value.setting == "OBLETH_ROUTING_LOAD_BOUND"
    assert complaint in str(caught.value)


def test_a_session_header_is_stored_lower_case() -> None:
    """Header names are case-insensitive; the setting keeps the lower-case form."""
    assert Settings(session_header=" X-Conversation-Id ").session_header == "x-conversation-id"
    assert Settings().session_header == "x-session-id"


@pytest.mark.parametrize("header", ["x session", "x-session:", "", "  ", None, 7, "sess\u00efon"])
def test_an_invalid_session_header_is_refused(header: Any) -> None:
    """A session header that is no HTTP header name names ``session_header``."""
    with pytest.raises(ConfigError) as caught:
        Settings(session_header=header)
    assert caught.value.setting == "session_header"
    assert "HTTP header name" in str(caught.value)


def test_an_invalid_obleth_session_header_names_the_variable() -> None:
    """From the environment the error names ``OBLETH_SESSION_HEADER``."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_SESSION_HEADER": "x session"})
    assert caught.value.setting == "OBLETH_SESSION_HEADER"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("routing_seed", "7"),
        ("routing_seed", 1.5),
        ("prefix_block_bytes", 0),
        ("prefix_index_blocks", 0),
        ("upstream_poll_interval_s", 0),
        ("upstream_poll_timeout_s", -1),
        ("upstream_header", "yes"),
    ],
)
def test_other_routing_settings_refuse_bad_values_by_name(name: str, value: Any) -> None:
    """The remaining routing settings also name themselves when given a bad value."""
    with pytest.raises(ConfigError) as caught:
        Settings(**{name: value})
    assert caught.value.setting == name


def test_routing_settings_read_from_the_environment() -> None:
    """Every routing setting has an ``OBLETH_*`` form."""
    settings = Settings.from_env(
        {
            "OBLETH_UPSTREAMS": A,
            "OBLETH_ROUTING_POLICY": "least-loaded",
            "OBLETH_ROUTING_LOAD_BOUND": "2.5",
            "OBLETH_ROUTING_SEED": "42",
            "OBLETH_SESSION_HEADER": "X-Chat-Id",
            "OBLETH_UPSTREAM_HEADER": "true",
            "OBLETH_PREFIX_BLOCK_BYTES": "128",
            "OBLETH_PREFIX_INDEX_BLOCKS": "1000",
            "OBLETH_UPSTREAM_POLL_INTERVAL_S": "0.5",
            "OBLETH_UPSTREAM_POLL_TIMEOUT_S": "0.1",
        }
    )
    assert settings.upstreams == (Upstream(A),)
    assert settings.routing_policy == "least-loaded"
    assert settings.routing_load_bound == 2.5
    assert settings.routing_seed == 42
    assert settings.session_header == "x-chat-id"
    assert settings.upstream_header is True
    assert (settings.prefix_block_bytes, settings.prefix_index_blocks) == (128, 1000)
    assert (settings.upstream_poll_interval_s, settings.upstream_poll_timeout_s) == (0.5, 0.1)
    assert Settings.from_env({"OBLETH_ROUTING_SEED": ""}).routing_seed is None
