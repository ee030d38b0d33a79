"""coci's version: the distribution's (pyproject.toml reads it from here) and the one every
checkpoint manifest records (``coci_version``)."""

__version__ = "0.1.0"
