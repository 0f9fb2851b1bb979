"""launch.recovery: the recover-or-stop decision and what a job's log says of its progress."""

from __future__ import annotations

import json

from traind.launch.recovery import Ending, Progress, decide, steps_lost, unreachable_verdict


def test_a_job_that_ended_early_is_recovered_with_its_reason() -> None:
    """A timeout before the trainer finished, recoveries left: recover, saying why."""
    d = decide(Ending("timeout", "Job timed out"), recoveries=1, max_recoveries=3,
               taken_down=False)
    assert d.recover
    assert d.reason == "ended timeout: Job timed out"


def test_finished_detached_and_taken_down_stop() -> None:
    """The trainer's exit 0, a detach and a ``launch down`` each stop the loop."""
    assert decide(Ending("finished"), 0, 3, False).reason == "finished"
    assert decide(Ending("detached"), 0, 3, False).reason == "detached"
    assert decide(Ending("error"), 0, 3, True).reason == "taken down"
    assert not decide(Ending("error"), 0, 3, True).recover


def test_max_recoveries_reached_stops_with_the_count() -> None:
    """After max_recoveries, an early end stops, naming the limit."""
    d = decide(Ending("gone"), recoveries=2, max_recoveries=2, taken_down=False)
    assert not d.recover
    assert "max_recoveries = 2" in d.reason


def test_progress_reads_steps_and_the_newest_commit() -> None:
    """The step reached (trainer text) and the committed checkpoint (traind JSON) give the
    steps lost."""
    p = Progress()
    p.see("step=3 loss=1.0")
    p.see(json.dumps({"event": "checkpoint_committed", "tag": "checkpoint-4", "step": 4}))
    p.see(json.dumps({"event": "trainer_output", "line": "step=7 loss=0.5"}))
    ending = p.ending("timeout", "")
    assert (ending.checkpoint, ending.reached_step) == ("checkpoint-4", 7)
    assert steps_lost(ending) == 3
    assert steps_lost(Progress().ending("gone", "")) is None


def test_an_unreachable_host_past_the_bound_is_dead() -> None:
    """A host silent longer than the bound while its provider lists it is dead; at or under
    the bound it is waited for."""
    assert unreachable_verdict(False, False, unreachable_for=30.5, bound=30) == "dead"
    assert unreachable_verdict(False, False, unreachable_for=30.0, bound=30) == "waiting"
    assert unreachable_verdict(False, False, unreachable_for=0.0, bound=30) == "waiting"


def test_a_host_answering_again_is_a_blip() -> None:
    """A host that answers again is back, however long it was silent."""
    assert unreachable_verdict(False, True, unreachable_for=5, bound=30) == "back"
    assert unreachable_verdict(False, True, unreachable_for=99, bound=30) == "back"


def test_a_host_its_provider_lists_ended_is_gone() -> None:
    """The provider's listing (stopped or destroyed) wins over waiting or the bound."""
    assert unreachable_verdict(True, False, unreachable_for=1, bound=30) == "gone"
    assert unreachable_verdict(True, False, unreachable_for=99, bound=30) == "gone"


def test_an_unreachable_end_is_recovered_with_its_seconds() -> None:
    """A dead host's end is recovered, its reason naming how long it was unreachable."""
    d = decide(Ending("unreachable", "unreachable for 31 s while runpod lists it running"),
               recoveries=0, max_recoveries=3, taken_down=False)
    assert d.recover
    assert d.reason == "ended unreachable: unreachable for 31 s while runpod lists it running"


def test_a_job_exiting_0_has_finished_only_after_run_complete() -> None:
    """A job that exited 0 finished when traind logged run_complete; without it traind was
    stopped (SIGTERM/SIGINT commit and exit 0) and the job is "stopped", to be recovered."""
    stopped = Progress()
    stopped.see(json.dumps({"event": "supervisor_stopped", "outcome": "stopped"}))
    ending = stopped.job_ending(True, "completed", "exited with status 0")
    assert ending.state == "stopped"
    assert "before traind's run_complete" in ending.message
    assert decide(ending, 0, 3, taken_down=False).recover
    done = Progress()
    done.see(json.dumps({"event": "run_complete", "exit": True}))
    assert done.job_ending(True, "completed", "").state == "finished"
    assert done.job_ending(False, "timeout", "ran 60s").state == "timeout"
