"""Placement by measured memory (issue 29): the room of each device, each preset's
footprint (estimated from its GGUF header, then measured), and the rule that places
engines and evicts idle ones so that a start never fails for memory. Pure: the daemon
and the gateway feed it figures and carry out what it says."""
