"""The package's own error type: a problem with the user's input or files, with a message
that says what is wrong and how to fix it (the CLI prints it without a traceback)."""


class ElmoError(Exception):
    """Base class of errors caused by input, configuration or files."""
