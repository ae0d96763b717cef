"""Config and presets: ``lokid.toml`` and ``presets/<name>.toml`` read into typed values
(``files``), the bounded TOML reading and its located errors (``tomlread``, ``tomlscan``),
edits that keep every comment (``presetedit``), the preset name rule (``presetname``),
secrets (``secrets``), external presets (``external``) and aliases (``aliases``).

A file's every error names the file, the line, the key and what would be valid; the edit
and the check read the same rules as the start, so a file ``lokictl check`` passes starts.
``files`` gathers the tables the other topics define (``[serve]``, ``[placement]``,
``[rpc]``, a pulled model, the engine's flags), so it imports them; the rules that take a
loaded preset (the plan, a replica's port) import ``files`` back. Packages may lean on
each other so; modules may not form a circle (tests/test_layout.py).

Who uses it: every lokid process (the daemon, the gateway, ``lokid prestart``, lokictl).
May import: :mod:`lokid.core.launch`, :mod:`lokid.core.model`, :mod:`lokid.core.serve`,
:mod:`lokid.core.place`, :mod:`lokid.core.fleet`, and the core's root modules.
"""
