"""``python -m nonstop``: the ``nonstop`` command line."""

from nonstop.admin.cli import main

main()
