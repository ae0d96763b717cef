"""The benchmark: its protocol over HTTP and its one orchestration, shared by
``lokid bench`` and the daemon's ``Bench()``.
"""
