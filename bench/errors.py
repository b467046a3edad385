"""The errors a user fixes by a setting or a command: `python -m bench` prints their one-line messages and exits
with status 2, without a traceback."""
from __future__ import annotations


class MissingArtifactError(RuntimeError):
    """An artifact (package, weights, datastore) a run needs is not there; the message says how to get it."""


class InvalidArtifactError(MissingArtifactError):
    """An artifact is there but unusable (a truncated or corrupt file, weights whose keys or shapes do not fit); the
    message names the file and how to replace it."""


class ConfigError(ValueError):
    """Values a run cannot use; the message has one line per problem (`python -m bench` exits with status 2)."""
