"""The D-Bus edge: the interface classes (they only delegate), the daemon, the
registry it serves and the authorisation.
"""
