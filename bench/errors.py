"""The errors a user fixes by a setting or a command: every command prints their one-line messages and exits with
status 2, without a traceback (exit_on_user_error)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class MissingArtifactError(RuntimeError):
    """An artifact (package, weights, datastore) a run needs is not there; the message says how to get it."""


class InvalidArtifactError(MissingArtifactError):
    """An artifact is there but unusable (a truncated or corrupt file, weights whose keys or shapes do not fit); the
    message names the file and how to replace it."""


class ConfigError(ValueError):
    """Values a run cannot use; the message has one line per problem (`python -m bench` exits with status 2)."""


@contextmanager
def exit_on_user_error(*also: type[Exception]) -> Iterator[None]:
    """A ConfigError, a MissingArtifactError or one of `also` raised inside ends the command: one `error: <line>` on
    stderr per line of its message, exit status 2."""
    try:
        yield
    except (ConfigError, MissingArtifactError, *also) as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
