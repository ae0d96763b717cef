"""lokid: run llama.cpp's llama-server on GPU servers the systemd way."""

__version__ = "0.2.0"
