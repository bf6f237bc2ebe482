"""Bad configuration stops startup with a message naming the setting, value and fix."""

from __future__ import annotations

import dataclasses

import pytest

from gateway import ConfigError, Gateway, GatewayMiddleware, Settings
from gateway.settings import setting_names
from gateway.settings.declared import specs_of
from gateway.settings.environ import plugin_prefixes
from gateway.settings.parsers import READS_BLANK


def test_defaults_are_usable() -> None:
    """Settings() with nothing set is a working configuration."""
    settings = Settings()
    assert settings.global_max_in_flight == 64 and settings.overflow_policy == "block"


def test_environment_variables_configure_every_setting_kind() -> None:
    """OBLETH_* variables parse numbers, lists, weights, caps and booleans."""
    settings = Settings.from_env(
        {
            "OBLETH_GLOBAL_MAX_IN_FLIGHT": "128",
            "OBLETH_CAPACITY_PROVIDERS": "static",
            "OBLETH_QUEUE_TIMEOUT_S": "2.5",
            "OBLETH_TENANT_WEIGHTS": "gold:4,free:1",
            "OBLETH_TENANT_MAX_IN_FLIGHT": "free:3,*:10",
            "OBLETH_TENANT_RPM": "free:60,*:600",
            "OBLETH_TENANT_TPM": "5000",
            "OBLETH_DEFAULT_MAX_TOKENS": "128",
            "OBLETH_TRUST_PRIORITY_HEADER": "true",
            "OBLETH_EXEMPT_PATHS": "/healthz,/admin/",
            "OBLETH_TENANT_HEADER": "X-Tenant",
            "UNRELATED": "ignored",
        }
    )
    assert settings.global_max_in_flight == 128
    assert settings.queue_timeout_s == 2.5
    assert dict(settings.tenant_weights) == {"gold": 4.0, "free": 1.0}
    assert dict(settings.tenant_max_in_flight) == {"free": 3, "*": 10}  # type: ignore[arg-type]
    assert dict(settings.tenant_rpm) == {"free": 60, "*": 600}  # type: ignore[arg-type]
    assert settings.tenant_tpm == 5000 and settings.default_max_tokens == 128
    assert settings.trust_priority_header is True
    assert settings.exempt_paths == ("/healthz", "/admin")
    assert settings.tenant_header == "x-tenant"


def test_keyword_overrides_win_over_the_environment() -> None:
    """from_env(**overrides) lets code pin a value the environment also sets."""
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "8"}
    assert Settings.from_env(env, global_max_in_flight=3).global_max_in_flight == 3


def test_errors_name_a_variable_only_for_values_read_from_the_environment() -> None:
    """A keyword override (a command's flag) is named as the keyword, a value from the
    environment as its variable: never a variable the user did not set."""
    with pytest.raises(ConfigError, match=r"^global_max_in_flight=0"):
        Settings.from_env({}, global_max_in_flight=0)
    with pytest.raises(ConfigError, match=r"^OBLETH_MAX_QUEUE=-3"):
        Settings.from_env({"OBLETH_MAX_QUEUE": "-3"}, global_max_in_flight=5)


@pytest.mark.parametrize(
    ("environ", "shown"),
    [
        ({"OBLETH_EXEMPT_PATHS": "healthz,/readyz"}, "OBLETH_EXEMPT_PATHS='healthz,/readyz'"),
        ({"OBLETH_CAPACITY_PROVIDERS": "static, static"}, "='static, static'"),
        ({"OBLETH_TENANT_WEIGHTS": "gold:4,gold:2"}, "OBLETH_TENANT_WEIGHTS='gold:4,gold:2'"),
    ],
)
def test_a_bad_list_from_the_environment_is_shown_as_written(
    environ: dict[str, str], shown: str
) -> None:
    """The message shows the variable's text, which the user can find in their manifest,
    not the Python tuple or dict it was parsed into."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert shown in str(caught.value)
    with pytest.raises(ConfigError, match=r"^exempt_paths=\('healthz',\)"):
        Settings(exempt_paths=("healthz",))


def test_a_variable_named_in_lower_case_after_the_prefix_is_read() -> None:
    """``OBLETH_global_max_in_flight`` has always been read as the setting; keeping each
    variable's text for error messages must not trip over its spelling."""
    settings = Settings.from_env({"OBLETH_global_max_in_flight": "5"})
    assert settings.global_max_in_flight == 5
    assert settings.env_text == {"global_max_in_flight": "5"}


def test_a_value_changed_by_replace_is_named_as_a_keyword() -> None:
    """``replace`` gives keywords: an error about one must not name the variable it
    replaced (the user would look for the mistake in the environment)."""
    settings = Settings.from_env({"OBLETH_MAX_QUEUE": "5", "OBLETH_QUEUE_TIMEOUT_S": "2"})
    with pytest.raises(ConfigError, match=r"^max_queue=-1"):
        settings.replace(max_queue=-1)
    with pytest.raises(ConfigError, match=r"^OBLETH_QUEUE_TIMEOUT_S=-1"):
        dataclasses.replace(settings, queue_timeout_s=-1)
    assert settings.replace(max_queue=7).label("queue_timeout_s") == "OBLETH_QUEUE_TIMEOUT_S"


def test_every_setting_has_an_environment_variable() -> None:
    """Each Settings field (but its source markers) is reachable as OBLETH_<NAME>."""
    fields = {f.name for f in dataclasses.fields(Settings)} - {"env_text"}
    assert set(setting_names()) == fields


@pytest.mark.parametrize(
    ("env", "named", "hint"),
    [
        ({"OBLETH_GLOBAL_MAX_IN_FLIGHT": "0"}, "OBLETH_GLOBAL_MAX_IN_FLIGHT=0", "at least 1"),
        ({"OBLETH_GLOBAL_MAX_IN_FLIGHT": "-5"}, "OBLETH_GLOBAL_MAX_IN_FLIGHT=-5", "at least 1"),
        (
            {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "lots"},
            "OBLETH_GLOBAL_MAX_IN_FLIGHT='lots'",
            "whole number",
        ),
        ({"OBLETH_TENANT_WEIGHTS": "gold:x"}, "OBLETH_TENANT_WEIGHTS='gold:x'", "gold:4,free:1"),
        ({"OBLETH_TENANT_WEIGHTS": "gold:0"}, "OBLETH_TENANT_WEIGHTS='gold:0'", "greater than 0"),
        ({"OBLETH_QUEUE_TIMEOUT_S": "-1"}, "OBLETH_QUEUE_TIMEOUT_S=-1.0", "above 0"),
        ({"OBLETH_DEFAULT_PRIORITY": "urgent"}, "OBLETH_DEFAULT_PRIORITY='urgent'", "critical"),
        (
            {"OBLETH_TRUST_PRIORITY_HEADER": "maybe"},
            "OBLETH_TRUST_PRIORITY_HEADER='maybe'",
            "true or false",
        ),
        (
            {"OBLETH_GLOBAL_MAX_INFLIGHT": "3"},
            "OBLETH_GLOBAL_MAX_INFLIGHT='3'",
            "did you mean OBLETH_GLOBAL_MAX_IN_FLIGHT",
        ),
        ({"OBLETH_EXEMPT_PATHS": "healthz"}, "OBLETH_EXEMPT_PATHS=", "paths start with '/'"),
        (  # it would replace the default list with one path no request has
            {"OBLETH_EXEMPT_PATHS": "/healthz /metrics"},
            "OBLETH_EXEMPT_PATHS=",
            "separate paths with commas",
        ),
        ({"OBLETH_EXEMPT_PATHS": "/a?b=1"}, "OBLETH_EXEMPT_PATHS=", "leave out any query"),
        (
            {"OBLETH_TENANT_MAX_IN_FLIGHT": "free:1.5"},
            "OBLETH_TENANT_MAX_IN_FLIGHT='free:1.5'",
            "whole number",
        ),
        ({"OBLETH_TENANT_MAX_IN_FLIGHT": "free:0"}, "OBLETH_TENANT_MAX_IN_FLIGHT=", "free: cap 0"),
        ({"OBLETH_TENANT_MAX_IN_FLIGHT": "x"}, "OBLETH_TENANT_MAX_IN_FLIGHT='x'", "free:4,*:16"),
        ({"OBLETH_TENANT_RPM": "free:0"}, "OBLETH_TENANT_RPM=", "free: budget 0"),
        ({"OBLETH_TENANT_TPM": "lots"}, "OBLETH_TENANT_TPM='lots'", "tenant:budget pairs"),
        ({"OBLETH_DEFAULT_MAX_TOKENS": "-1"}, "OBLETH_DEFAULT_MAX_TOKENS=", "at least 0"),
        ({"OBLETH_DEFAULT_TENANT_WEIGHT": "x"}, "OBLETH_DEFAULT_TENANT_WEIGHT='x'", "a weight"),
        ({"OBLETH_ROUTING_LOAD_BOUND": "x"}, "OBLETH_ROUTING_LOAD_BOUND='x'", "a number, e.g."),
        ({"OBLETH_EXEMPT_PATHS": "/a,/a/"}, "OBLETH_EXEMPT_PATHS=", "listed twice"),
        (
            {"OBLETH_LEASE_TTL_S": "1", "OBLETH_REDIS_RETRY_BUDGET_S": "1"},
            "OBLETH_LEASE_TTL_S=1.0",
            "OBLETH_REDIS_RETRY_BUDGET_S=1 s",
        ),
        # a conflict with a default the user never wrote blames what the user wrote
        (
            {"OBLETH_REDIS_RETRY_BUDGET_S": "10"},
            "OBLETH_REDIS_RETRY_BUDGET_S=10.0",
            "expected at most 6.67 s",
        ),
        (
            {"OBLETH_TENANT_HEADER": "x-priority"},
            "OBLETH_TENANT_HEADER='x-priority'",
            "choose another tenant header, e.g. x-tenant",
        ),
        (
            {"OBLETH_TENANT_HEADER": "x-team", "OBLETH_PRIORITY_HEADER": "x-team"},
            "OBLETH_PRIORITY_HEADER='x-team'",
            "already names the tenant; choose a header of its own, e.g. x-priority",
        ),
        # counts go to Redis' scripts, whose numbers turn to exponents from 10^14 on
        (
            {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "100000000000000"},
            "OBLETH_GLOBAL_MAX_IN_FLIGHT=100000000000000",
            "at most 1000000000",
        ),
        ({"OBLETH_MAX_QUEUE": "1000000001"}, "OBLETH_MAX_QUEUE=", "at most 1000000000"),
        (
            {"OBLETH_REDIS_URL": "redis://:secret@h:6379/0?db=x"},
            "OBLETH_REDIS_URL='redis://:***@h:6379/0?db=x'",
            "Invalid value for 'db'",
        ),
        ({"OBLETH_REDIS_URL": "redis+cluster://"}, "OBLETH_REDIS_URL=", "at least one host"),
        (
            {"OBLETH_UPSTREAM_POLL_INTERVAL_S": "1e-6"},
            "OBLETH_UPSTREAM_POLL_INTERVAL_S=1e-06",
            "at least 0.01 s",
        ),
    ],
)
def test_bad_environment_names_the_variable_value_and_fix(
    env: dict[str, str], named: str, hint: str
) -> None:
    """Each bad OBLETH_* value is refused with the variable, the value and what is accepted."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert str(caught.value).startswith(named)
    assert hint in str(caught.value)


def test_kubernetes_service_links_for_a_service_named_obleth_are_left_alone() -> None:
    """Kubernetes sets ``<SERVICE>_SERVICE_HOST``, ``<SERVICE>_PORT_8000_TCP_ADDR`` and
    the like in every pod for each Service of the namespace: with a Service named
    ``obleth`` (contrib/kubernetes has one) the gateway's pods stopped at startup on
    variables nobody wrote. A misspelt setting is still an error."""
    links = {
        "OBLETH_SERVICE_HOST": "10.96.0.10",
        "OBLETH_SERVICE_PORT": "8000",
        "OBLETH_SERVICE_PORT_HTTP": "8000",
        "OBLETH_PORT": "tcp://10.96.0.10:8000",
        "OBLETH_PORT_8000_TCP": "tcp://10.96.0.10:8000",
        "OBLETH_PORT_8000_TCP_PROTO": "tcp",
        "OBLETH_PORT_8000_TCP_PORT": "8000",
        "OBLETH_PORT_8000_TCP_ADDR": "10.96.0.10",
        "OBLETH_REDIS_SERVICE_HOST": "10.96.0.11",
        "OBLETH_REDIS_PORT_6379_TCP_ADDR": "10.96.0.11",
        "OBLETH_MAX_QUEUE": "7",
    }
    assert Settings.from_env(links).max_queue == 7
    with pytest.raises(ConfigError, match="no such setting"):  # no Service: a typo
        Settings.from_env({"OBLETH_PORT": "9000"})
    with pytest.raises(ConfigError, match="did you mean OBLETH_REDIS_URL"):
        Settings.from_env({**links, "OBLETH_REDIS_URI": "redis://h:6379/0"})


def test_a_blank_variable_is_unset() -> None:
    """``OBLETH_X=`` (a deployment template's value left out) keeps the default: a blank
    ``OBLETH_EXEMPT_PATHS`` must not take the probes' exemption away, nor a blank number
    stop startup; only the settings whose doc gives empty a meaning read it (no limit)."""
    blank = {
        spec.env: "  " for spec in specs_of(Settings).values() if spec.parse not in READS_BLANK
    }
    assert "OBLETH_EXEMPT_PATHS" in blank
    assert Settings.from_env(blank) == Settings()
    assert Settings.from_env(blank).env_names == frozenset()
    timeouts = Settings.from_env({"OBLETH_UPSTREAM_READ_TIMEOUT_S": ""})
    assert Settings().upstream_read_timeout_s == 300
    assert timeouts.upstream_read_timeout_s is None


def test_an_installed_plugins_own_variables_are_left_to_it() -> None:
    """``OBLETH_<PLUGIN>_*`` belongs to the plugin of that name when it is installed (the
    README's test command installs ``kv-pressure``); a near miss is still an error."""
    assert "OBLETH_KV_PRESSURE_" in plugin_prefixes()
    settings = Settings.from_env({"OBLETH_KV_PRESSURE_HIGH": "0.95", "OBLETH_MAX_QUEUE": "9"})
    assert settings.max_queue == 9
    with pytest.raises(ConfigError, match=r"OBLETH_KV_PRESURE_HIGH='0\.95': no such setting"):
        Settings.from_env({"OBLETH_KV_PRESURE_HIGH": "0.95"})


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("OBLETH_KV_PRESURE_HIGH", "OBLETH_KV_PRESSURE_HIGH"),
        ("OBLETH_KVPRESSURE_LOW", "OBLETH_KV_PRESSURE_LOW"),
        ("OBLETH_ADAPTIV_FLOOR", "OBLETH_ADAPTIVE_FLOOR"),
        ("OBLETH_GLOBAL_MAX_INFLIGHT", "OBLETH_GLOBAL_MAX_IN_FLIGHT"),  # Obleth's own first
    ],
)
def test_a_misspelt_plugin_prefix_suggests_the_plugins_variable(written: str, meant: str) -> None:
    """The suggestion is the variable meant, the plugin's when the prefix is all but an
    installed plugin's (both are installed by the README's test command): it was the
    closest of Obleth's own, OBLETH_REDIS_URL for OBLETH_KV_PRESURE_HIGH."""
    with pytest.raises(ConfigError, match=f"no such setting; did you mean {meant}\\?"):
        Settings.from_env({written: "1"})


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("OBLETH_ADMIN_TOKN", "s3cret-0123456789abcdefXYZ"),
        ("OBLETH_TOKEN", "s3cret-0123456789abcdefXYZ"),
        ("OBLETH_REDIS_ULR", "redis://:s3cret@redis:6379/0"),
        ("OBLETH_REDIS_URI", "redis://redis:6379/0?password=s3cret"),
        ("OBLETH_REDIS_ULR", "user:s3cret@redis:6379"),
    ],
)
def test_a_misspelt_variable_that_may_hold_a_secret_is_named_without_its_value(
    written: str, value: str
) -> None:
    """The token is never logged: a typo in its variable's name (or in the Redis URL's,
    which may carry a password) is an error that names the variable, not the secret."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({written: value})
    assert str(caught.value).startswith(f"{written}='<hidden>': no such setting")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "named", "hint"),
    [
        ({"global_max_in_flight": 0}, "global_max_in_flight=0", "at least 1"),
        ({"global_max_in_flight": True}, "global_max_in_flight=True", "whole number"),
        ({"tenant_weights": {"gold": "x"}}, "tenant_weights=", "not a number"),
        ({"tenant_weights": {"gold": 2, " gold": 1}}, "tenant_weights=", "'gold' is given twice"),
        ({"tenant_max_in_flight": 0}, "tenant_max_in_flight=0", "at least 1"),
        ({"tenant_max_in_flight": {"free": 0}}, "tenant_max_in_flight=", "free: cap 0"),
        ({"tenant_max_in_flight": {" ": 2}}, "tenant_max_in_flight=", "' ' is not a name"),
        ({"tenant_max_in_flight": {"a": 2, "a ": 3}}, "tenant_max_in_flight=", "given twice"),
        ({"tenant_rpm": 0}, "tenant_rpm=0", "at least 1"),
        ({"tenant_tpm": {"free": 1.5}}, "tenant_tpm=", "free: budget 1.5"),
        ({"max_queue": -1}, "max_queue=-1", "at least 0"),
        ({"capacity_providers": []}, "capacity_providers=[]", "at least one"),
        ({"tenant_header": "bad header"}, "tenant_header='bad header'", "header name"),
        (
            {"tenant_header": "x-team", "priority_header": "X-Team"},
            "priority_header='X-Team'",
            "already names the tenant",
        ),
        ({"priority_header": "authorization"}, "priority_header=", "a header of its own"),
        ({"global_max_inflight": 3}, "global_max_inflight=3", "did you mean global_max_in_flight"),
        ({"queue_timeout_s": 10**400}, "queue_timeout_s=1000", "finite number of seconds"),
        ({"learning_window_s": 10**400}, "learning_window_s=1000", "number of seconds"),
        ({"routing_load_bound": 10**400}, "routing_load_bound=1000", "finite number"),
        ({"default_tenant_weight": 10**400}, "default_tenant_weight=1000", "too large"),
        ({"tenant_weights": {"gold": 10**5000}}, "tenant_weights=", "gold: weight is too large"),
        ({"exempt_paths": ("/a", "/a/")}, "exempt_paths=", "listed twice"),
        ({"env_text": 5}, "env_text=5", "set by Settings.from_env"),
        ({"lease_ttl_s": 0.01}, "lease_ttl_s=0.01", "at least 0.5 seconds"),
        (
            {"lease_ttl_s": 2, "redis_retry_budget_s": 5},
            "lease_ttl_s=2.0",
            "retrying Redis for redis_retry_budget_s=5 s would lose its leases",
        ),
    ],
)
def test_bad_keywords_name_the_setting_value_and_fix(
    kwargs: dict[str, object], named: str, hint: str
) -> None:
    """Settings(...) refuses bad values the same way, naming the keyword."""
    with pytest.raises(ConfigError) as caught:
        Settings(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(named)
    assert hint in str(caught.value)


SECONDS_SETTINGS = [name for name in setting_names() if name.endswith("_s")]


@pytest.mark.parametrize("name", SECONDS_SETTINGS)
def test_every_seconds_setting_refuses_more_than_a_day(name: str) -> None:
    """A number of seconds past one day is a typo or an attempt at "never": it is refused
    naming the setting and the bound, rather than sent as a 21-digit ``Retry-After`` or
    left to overflow where it is turned into milliseconds."""
    with pytest.raises(ConfigError) as caught:
        Settings(**{name: 1e20})
    assert str(caught.value).startswith(f"{name}=1e+20: ")
    assert "at most 86400 seconds (one day)" in str(caught.value)
    with pytest.raises(ConfigError, match=f"^OBLETH_{name.upper()}=86400.5: "):
        Settings.from_env({f"OBLETH_{name.upper()}": "86400.5"})


@pytest.mark.parametrize("name", SECONDS_SETTINGS)
def test_every_seconds_setting_takes_a_whole_day(name: str) -> None:
    """One day itself is accepted (a retry budget that long needs a lease 1.5 times it)."""
    values: dict[str, float] = {name: 86400}
    if name == "redis_retry_budget_s":
        values = {name: 86400 / 1.5, "lease_ttl_s": 86400}
    assert getattr(Settings(**values), name) == values[name]  # type: ignore[arg-type]


def test_a_timeout_that_may_be_unlimited_says_how_to_unset_it() -> None:
    """Past a day, the upstream timeouts point to what "no limit" is spelled as."""
    with pytest.raises(ConfigError, match="or None for no limit"):
        Settings(upstream_read_timeout_s=1e20)
    with pytest.raises(ConfigError, match="or leave it empty for no limit"):
        Settings.from_env({"OBLETH_UPSTREAM_RESPONSE_TIMEOUT_S": "1e20"})


def test_tenant_names_in_weights_and_caps_lose_surrounding_whitespace() -> None:
    """A tenant is named by a header value read without surrounding whitespace, so a
    weight or cap for " gold " applies to gold, as in the OBLETH_* lists."""
    settings = Settings(tenant_weights={" gold ": 3}, tenant_max_in_flight={"free ": 2, "*": 9})
    assert dict(settings.tenant_weights) == {"gold": 3.0}
    assert settings.tenant_caps() == ({"free": 2}, 9)


def test_unknown_policy_lists_the_installed_ones() -> None:
    """An unknown overflow policy stops the gateway and lists what is installed."""
    with pytest.raises(ConfigError) as caught:
        Gateway(Settings.from_env({"OBLETH_OVERFLOW_POLICY": "drop"}), entry_points=False)
    message = str(caught.value)
    assert message.startswith("OBLETH_OVERFLOW_POLICY='drop': no overflow policy by that name")
    assert "block, drop-newest, drop-oldest" in message


def test_unknown_capacity_provider_lists_the_installed_ones() -> None:
    """An unknown provider name stops the gateway and lists what is installed."""
    with pytest.raises(ConfigError, match=r"capacity_providers='vllm'.*installed: static"):
        Gateway(Settings(capacity_providers=["static", "vllm"]), entry_points=False)


def test_middleware_raises_config_errors_when_built() -> None:
    """Adding the middleware with a bad environment fails at app startup, not per request."""

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("never reached")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OBLETH_MAX_QUEUE", "-3")
        with pytest.raises(ConfigError, match="OBLETH_MAX_QUEUE=-3"):
            GatewayMiddleware(app)  # type: ignore[arg-type]


def test_one_setting_set_by_two_spellings_of_its_variable_is_refused() -> None:
    """Variables are read whatever their case: ``OBLETH_max_queue`` beside
    ``OBLETH_MAX_QUEUE`` used to win or lose silently, by the environment's order. A
    secret's value is not shown."""
    with pytest.raises(ConfigError, match="OBLETH_MAX_QUEUE sets the same setting"):
        Settings.from_env({"OBLETH_MAX_QUEUE": "5", "OBLETH_max_queue": "7"})
    assert Settings.from_env({"OBLETH_max_queue": "7"}).max_queue == 7
    token = "s3cret-0123456789abcdefXYZ"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OBLETH_ADMIN_TOKEN": token, "OBLETH_admin_token": token})
    assert token not in str(caught.value)


def test_a_message_about_another_setting_names_it_as_the_user_wrote_theirs() -> None:
    """A check that points at a second setting names it by its variable when the setting
    at fault came from the environment, by its keyword in code."""
    with pytest.raises(ConfigError, match=r"or a longer OBLETH_LEASE_TTL_S$"):
        Settings.from_env({"OBLETH_REDIS_RETRY_BUDGET_S": "10"})
    with pytest.raises(ConfigError, match=r"or a longer lease_ttl_s$"):
        Settings(redis_retry_budget_s=10)
    with pytest.raises(ConfigError, match="set OBLETH_PRIORITY_HEADER to a header"):
        Settings.from_env({"OBLETH_TENANT_HEADER": "x-priority"})
