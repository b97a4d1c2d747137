"""One node process: configuration, data folder, the machine it runs, and ``serve``."""
