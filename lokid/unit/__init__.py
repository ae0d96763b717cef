"""What systemd runs for an engine: ``loki-engine@<preset>.service``'s own processes.

Who runs it: systemd. ``lokid prestart`` (ExecStartPre=), ``lokid engine`` (ExecStart=:
the supervisor, llama-server as its child, READY=1 when it answers), ``lokid stopped``
(ExecStopPost=), and the generator at boot and on daemon-reload. ``lokid run`` runs the
same supervisor in the foreground, and the daemon's local runner the same steps.
May import: :mod:`lokid.core`, :mod:`lokid.host`, :mod:`lokid.store`, :mod:`lokid.planning`.
"""
