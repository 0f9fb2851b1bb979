"""The errors of ``traind launch``, all under TraindError; each docstring is the default message."""

from __future__ import annotations

from traind.errors import TraindError


class LaunchError(TraindError):
    """traind launch failed."""


class NoOffersError(LaunchError):
    """No offer matches the constraints."""


class ProvisionError(LaunchError):
    """The backend refused or failed to provision a host."""


class InstanceNotFoundError(LaunchError):
    """The instance does not exist (any more)."""


class HostUnreachableError(LaunchError):
    """The host cannot be reached over SSH."""


class RemoteCommandError(LaunchError):
    """A command on the host failed."""


class BackendAPIError(LaunchError):
    """The backend's API failed, also after retries."""


class LaunchNotFoundError(LaunchError):
    """No saved launch by that name."""
