from sglang import __version__  # noqa: F401
