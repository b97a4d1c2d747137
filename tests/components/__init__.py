"""Components (F2) for the configuration tests: modules that ship configuration files."""
