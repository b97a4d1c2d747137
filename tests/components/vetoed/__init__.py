"""A component whose configuration the ``rates`` audit vetoes (a negative rate)."""

import tests.configmodel  # noqa: F401  (declares the ``rates`` type)

CONFIGURATION_FILES = ("bad.toml",)
