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
