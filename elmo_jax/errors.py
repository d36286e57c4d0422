"""The package's own error type: a problem with the user's input or files, with a message
that says what is wrong and how to fix it (the CLI prints it without a traceback)."""


class ElmoError(Exception):
    """Base class of errors caused by input, configuration or files."""


USER_ERRORS = (ElmoError, ValueError, TypeError, OSError)
"""What the command line reports as a one-line error instead of a traceback: the package's
own errors and the built-in ones raised for bad arguments and for files that cannot be
found, read or written (``OSError`` covers missing files, permissions and a full disk)."""
