"""Examples that use ntpref from the outside; importable from the repository root (``examples.adapters``)."""
