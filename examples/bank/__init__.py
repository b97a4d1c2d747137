"""The README's example application (``nonstop local up --app bank.model``)."""
