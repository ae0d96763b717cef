"""The benchmark: its protocol over HTTP and its one orchestration.

Who runs it: ``lokid bench`` (an operator, against a running engine) and the daemon's
``Bench()`` (for lokictl and busctl callers).
May import: :mod:`lokid.core`, :mod:`lokid.host`, :mod:`lokid.store`, :mod:`lokid.planning`.
"""
