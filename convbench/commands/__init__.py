"""The project's command-line tools, one module each, every one with ``main(argv=None, prog=...)``."""
