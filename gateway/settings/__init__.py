"""Settings: keyword arguments or ``OBLETH_*`` environment variables, validated at startup.

Every bad value raises ``ConfigError`` naming the setting as the user wrote it (the keyword
or the environment variable), the value, and what would be accepted. Names that depend on
installed plugins (providers, policies) are checked when a gateway assembles its plugins.

::

    fields.py      Settings: every setting once (type, default, parser, check, doc line)
    admission.py   its first part: the settings of admission control
    declared.py    setting(), the field that carries all that; Declared, how it behaves
    parsers.py     OBLETH_* text into values
    checks.py      values checked and normalised; cluster.py, those of cluster mode
    environ.py     reading OBLETH_* variables; names that are no setting
    doctable.py    the reference table of docs/configuration.md, generated
"""

from __future__ import annotations

from gateway.settings.checks import API_KEY_HEADERS, MIN_HEADER_BYTES
from gateway.settings.cluster import MIN_LEASE_TTL_S, shown_url
from gateway.settings.environ import ENV_PREFIX
from gateway.settings.fields import Settings, setting_names

__all__ = [
    "API_KEY_HEADERS",
    "ENV_PREFIX",
    "MIN_HEADER_BYTES",
    "MIN_LEASE_TTL_S",
    "Settings",
    "setting_names",
    "shown_url",
]
