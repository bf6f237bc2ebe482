"""Imports a dependency that is never installed, as a plugin with a missing requirement
would: loading this entry point raises ``ModuleNotFoundError``."""

from __future__ import annotations

import obleth_missing_dependency  # type: ignore[import-not-found]  # noqa: F401  # absent on purpose
