"""What touches a running engine or systemd: gathering a plan's inputs, the unit
helpers (prestart, engine), the supervisor, sd_notify, /proc, the state DB, the
journal watcher, the generator and the two runners (systemd, local).
"""
