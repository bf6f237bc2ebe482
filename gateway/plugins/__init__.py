"""Plugins: loaded through pluggy, checked at startup, fronted by one ``Plugins`` facade
per gateway (``facade.py``); what they offer by name (``offers.py``), the checks they pass
(``checks.py``) and the overflow policy's shield on the request path (``shield.py``)."""

from gateway.plugins.checks import ENTRY_POINT_GROUP
from gateway.plugins.facade import Plugins
from gateway.plugins.inventory import PluginInfo
from gateway.plugins.offers import Kind

__all__ = ["ENTRY_POINT_GROUP", "Kind", "PluginInfo", "Plugins"]
