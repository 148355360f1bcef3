"""Errors the command line turns into one clear line and exit code 2.

Anything the user can fix (a bad file, a bad flag value, a missing model dir) raises
`UsageError`; everything else is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


class FaultError(Exception):
    """The machine or a service failed under the tuner (storage gone, disk full), not the input:
    printed as one line, exit status 3.  Completed trials are kept; the same command resumes."""
