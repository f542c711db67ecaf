"""The command-line tools, one module each with ``main(argv=None, prog=...)``, and their flags."""
