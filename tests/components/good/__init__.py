"""A component shipping version ``shipped`` of ``rates/desk`` (tests.configmodel's type)."""

import tests.configmodel  # noqa: F401  (declares the ``rates`` type)

CONFIGURATION_FILES = ("desk.toml",)
