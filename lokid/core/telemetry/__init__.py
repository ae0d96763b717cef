"""What an engine says, read: its log lines as events and a load's verdict
(``enginelog``), its per-request lines as records (``requestlog``) and the figures an
operator reads (``figures``), its last error line (``lasterror``), the lines kept where
there is no journal (``logring``), the journal filter that drops per-request traces
(``journalfilter``) and journald's word that it dropped lines (``journalgap``).

Pure: the edges (the journal reader, the local runner, the generator) feed it lines.
Who uses it: the daemon and its watchers, the host's journal reader, the local runner,
the unit generator.
May import: the core's root modules only.
"""
