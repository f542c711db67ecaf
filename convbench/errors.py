"""Errors that the command-line tools report as one line and exit status 2."""


class UsageError(Exception):
    """Bad input from the user: a flag, a file, a name.

    The CLI prints ``str(err)`` on one line and exits with status 2, without a
    traceback.  Messages name the flag, or the file, line and field.
    """

    exit_status = 2


class LayerFileError(UsageError):
    """A problem in a layer CSV, located by file, line and (optionally) field."""

    def __init__(self, path, line, message, field=None):
        self.path = str(path)
        self.line = line
        self.field = field
        where = f"{self.path}:{line}" if line is not None else self.path
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")


def _argparse_base():
    import argparse
    return argparse.ArgumentParser


class ArgumentParser(_argparse_base()):
    """argparse whose errors are :class:`UsageError` (one line, exit status 2, no usage
    block), so that bad flags and bad values are reported the same way."""

    def error(self, message):
        raise UsageError(message)

    def parse_args(self, args=None, namespace=None):
        """Parse, then check the paths the flags name (``--outdir``, ``--cachedir``,
        ``--out``: :func:`convbench.files.check_paths`) before any work starts."""
        from .files import check_paths
        parsed = super().parse_args(args, namespace)
        check_paths(parsed)
        return parsed


def check_at_least(*checks) -> None:
    """For each ``(flag, value, least)``: a :class:`UsageError` naming the flag when
    ``value`` is given (not None) and below ``least``."""
    for flag, value, least in checks:
        if value is not None and value < least:
            raise UsageError(f"{flag}: must be an integer >= {least}, got {value}")


def check_choice(flag: str, value, choices, what: str) -> None:
    """A :class:`UsageError` naming ``flag`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise UsageError(f"{flag}: unknown {what} '{value}' (choose from {', '.join(choices)})")


def run_main(prog: str, body, argv=None) -> int:
    """``body(argv)``'s exit status, with usage errors printed as ``prog: error: ...``
    (status 2) and Ctrl-C as ``prog: interrupted`` (status 130), without a traceback."""
    import sys
    try:
        return body(argv)
    except UsageError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (``| head``): not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
