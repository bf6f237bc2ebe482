"""An Obleth plugin named ``tenant``: its variables are ``OBLETH_TENANT_*``."""
