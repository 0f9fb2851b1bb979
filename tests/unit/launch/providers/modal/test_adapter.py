"""The modal adapter's pure decisions: a return code's state, a library failure's error."""

from __future__ import annotations

from tests.support.requires import need_module

from traind.launch.errors import BackendAPIError, ProvisionError
from traind.launch.jobs import JobState


def test_return_codes_map_onto_job_states() -> None:
    """No code is running; 0, modal's timeout (124) and terminated (137) codes are named."""
    need_module("modal")
    from traind.launch.providers.modal.adapter import state_of

    assert [state_of(c) for c in (None, 0, 124, 137, 1)] == [
        JobState.RUNNING, JobState.COMPLETED, JobState.TIMEOUT, JobState.CANCELLED,
        JobState.ERROR]


def test_refusals_say_what_they_mean_and_server_errors_pass_through() -> None:
    """A refused token, a quota and a failed build are the refusal class with their meaning
    and Modal's words on one line; a server error is a BackendAPIError."""
    need_module("modal")
    import modal.exception as exc

    from traind.launch.providers.modal.adapter import translate

    token = translate(exc.AuthError("Token ID is\nmalformed"), "create", ProvisionError)
    assert isinstance(token, ProvisionError)
    assert "MODAL_TOKEN_ID" in str(token)
    assert "Token ID is malformed" in str(token)
    quota = translate(exc.ResourceExhaustedError("no H100"), "create", ProvisionError)
    assert "quota" in str(quota)
    build = translate(exc.ImageBuildError("pull failed", "im-1"), "create", ProvisionError)
    assert "could not build the image" in str(build)
    server = translate(exc.ServiceError("upstream"), "create", ProvisionError)
    assert type(server) is BackendAPIError
