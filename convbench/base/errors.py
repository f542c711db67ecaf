"""Errors that the command-line tools report as one line and exit status 2."""

import os

from convbench.base import files
from convkernels.cpu import caches, isa


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
        ``--out``: :func:`check_paths`) before any work starts."""
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
    except (UsageError, files.WriteError, isa.IsaCapError, caches.CachesError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (``| head``): not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def check_paths(args, environ=os.environ) -> None:
    """Check the paths of parsed flags before any work starts (:class:`UsageError`, one
    line): ``--outdir`` and ``--cachedir`` (or ``$CONVBENCH_CACHE``) must be writable
    folders or creatable, ``--out`` a writable file (where ``flags.add_out_flag`` declared
    it: some commands' ``--out`` names a folder, or a path on another machine)."""
    checks = [("--outdir", getattr(args, "outdir", None), files.writable_folder_problem)]
    if getattr(args, "check_out_file", False):
        checks.append(("--out", getattr(args, "out", None), files.output_file_problem))
    if hasattr(args, "cachedir"):
        if args.cachedir is not None:
            checks.append(("--cachedir", args.cachedir, files.writable_folder_problem))
        elif environ.get("CONVBENCH_CACHE"):
            checks.append(("$CONVBENCH_CACHE", environ["CONVBENCH_CACHE"],
                           files.writable_folder_problem))
    for flag, value, problem_of in checks:
        if value is None or not isinstance(value, (str, os.PathLike)):
            continue
        problem = problem_of(value)
        if problem and problem.startswith("cannot be created: "):
            raise UsageError(f"{flag}: cannot create {value}: {problem[19:]}")
        if problem:
            raise UsageError(f"{flag}: {value} {problem}")
