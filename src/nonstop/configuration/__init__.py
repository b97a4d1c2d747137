"""Versioned configuration (F1) and components (F2).

Configuration is typed, named and versioned: an application declares a type
(:func:`config_type`, a pydantic model, an audit, notifiers); operators load
versions from TOML files and activate them (``nonstop config``).  Every change
is one entry of the cluster log, so every node holds the same versions
(:mod:`nonstop.configuration.table`).  See docs/design/configuration.md.
"""

# The built-in type every node knows: groups of nodes (G3).
from nonstop.configuration import groups as _groups  # noqa: F401  (declares it)
from nonstop.configuration.types import TYPES, Change, ConfigType, ConfigTypes, Veto, config_type

__all__ = ["TYPES", "Change", "ConfigType", "ConfigTypes", "Veto", "config_type"]
