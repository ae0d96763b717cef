"""``python -m lokid``: the ``lokid`` command (the daemon's local runner starts its helpers so)."""


from .cli import entry

entry()
