"""A plan from the host: a preset's inputs gathered (config, model headers, the engine's
capabilities, RAM, the state DB's verdict) and the engine's port checked.

Who runs it: whoever plans a start: ``lokid plan``, the unit's prestart and engine steps,
the generator, the daemon (each preset's Argv) and the benchmark.
May import: :mod:`lokid.core`, :mod:`lokid.host`, :mod:`lokid.store`.
"""
