"""A user's own package named ``cluster``."""

WHOSE = "the user's cluster"
