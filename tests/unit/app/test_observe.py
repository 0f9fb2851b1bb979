"""The observer's metrics follow the supervised children it is told about."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from traind.app.observe import Observer
from traind.checkpoints.multinode.parts import WaitingParts
from traind.checkpoints.multinode.resume import Waiting
from traind.checkpoints.state.space import Pinned
from traind.config import RetentionConfig
from traind.layout.manifest import Manifest, Writer
from traind.status.render import render
from traind.supervisor.runner import ChildStatus

W = Writer("a" * 32, "h")


def restarts(observer: Observer) -> dict[str, float]:
    """``traind_child_restarts_total`` by child, as a scrape would see it."""
    text = observer.metrics.render().decode()
    return {
        s.labels["child"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "traind_child_restarts_total"
    }


def idle_streamer() -> Any:
    """What the Observer reads of a streamer with nothing to do."""
    return SimpleNamespace(queued=0, current=None, held={}, claim_ttl=600.0, waiting_parts={})


def test_restart_counters_start_at_zero_and_count_restarts() -> None:
    """A child's counter is exported at 0 from its first state change (so rate() and
    alerts see the series before the first restart), and counts each restart once."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "local", lambda: 0)
    vllm = ChildStatus("vllm", "vllm", "starting", None, 1, 0, None, 0.0, None)
    assert restarts(observer) == {}
    observer.child_changed(vllm)
    observer.child_changed(replace(vllm, state="healthy", pid=42))
    assert restarts(observer) == {"vllm": 0}
    observer.child_changed(replace(vllm, state="starting", starts=2, restarts=1))
    observer.child_changed(replace(vllm, state="healthy", starts=2, restarts=1))
    observer.child_changed(ChildStatus("trainer", "trainer", "running", 7, 1, 0, None, 0.0, None))
    assert restarts(observer) == {"vllm": 1, "trainer": 0}


def samples(observer: Observer, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name`` by their labels, as a scrape would see them."""
    text = observer.metrics.render().decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def test_failures_the_daemon_logs_are_counted() -> None:
    """Child exits (by child and code), failed checkpoint uploads and store retries are
    counted from the log events that report them."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "s3", lambda: 0)
    log = observer.recent.processor
    log(None, "info", {"event": "child_exited", "child": "trainer", "returncode": 17})
    log(None, "info", {"event": "child_exited", "child": "trainer", "returncode": 17})
    log(None, "info", {"event": "child_exited", "child": "vllm", "returncode": -9})
    log(None, "error", {"event": "checkpoint_upload_failed", "tag": "checkpoint-1"})
    log(None, "warning", {"event": "s3_retry", "op": "put_object"})
    log(None, "warning", {"event": "ssh_retry", "action": "upload"})
    log(None, "warning", {"event": "s3_retry", "op": "upload_part"})
    assert samples(observer, "traind_child_exits_total") == {
        (("child", "trainer"), ("code", "17")): 2, (("child", "vllm"), ("code", "-9")): 1,
    }
    assert samples(observer, "traind_upload_failures_total") == {(): 1}
    assert samples(observer, "traind_storage_retries_total") == {
        (("backend", "s3"),): 2, (("backend", "ssh"),): 1,
    }


def test_uploaded_bytes_move_as_the_upload_reports_them() -> None:
    """Bytes a backend reports sent count at once, not at commit; a retry taking bytes
    back does not make the counter go down."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "s3", lambda: 0)
    streamer.on_sent(5 * 1024 * 1024)
    streamer.on_sent(-1024)
    streamer.on_sent(1024)
    assert samples(observer, "traind_uploaded_bytes_total") == {(): 5 * 1024 * 1024 + 1024}


def test_dropped_checkpoints_are_counted_and_listed() -> None:
    """traind_checkpoints_dropped_total is exported at 0 and counts each dropped snapshot;
    /status lists them and ``traind status`` shows them on a line of their own."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "local", lambda: 0)

    def dropped_total() -> float:
        text = observer.metrics.render().decode()
        return next(s.value for fam in text_string_to_metric_families(text)
                    for s in fam.samples if s.name == "traind_checkpoints_dropped_total")

    assert dropped_total() == 0
    observer.dropped(Pinned("checkpoint-2", 2, 100, 100, False))
    observer.dropped(Pinned("checkpoint-1", 1, 100, 100, False))
    assert dropped_total() == 2
    status = observer.snapshot()
    assert [d["tag"] for d in status["dropped"]] == ["checkpoint-1", "checkpoint-2"]
    assert "dropped    2 not stored" in render(status)


def test_child_gauges_follow_state_changes() -> None:
    """traind_child_up is 1 only while a child is RUNNING, and traind_child_state marks the
    state it is in, from its first state change on."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "local", lambda: 0)
    trainer = ChildStatus("trainer", "trainer", "STARTING", None, 0, 0, None, 0.0, None)

    def current() -> tuple[float, list[str]]:
        up = samples(observer, "traind_child_up")[(("child", "trainer"),)]
        states = samples(observer, "traind_child_state")
        return up, [dict(k)["state"] for k, v in states.items() if v == 1]

    observer.child_changed(trainer)
    assert current() == (0, ["STARTING"])
    observer.child_changed(replace(trainer, state="RUNNING", pid=7, starts=1))
    assert current() == (1, ["RUNNING"])
    observer.child_changed(replace(trainer, state="BACKOFF", starts=1))
    assert current() == (0, ["BACKOFF"])


def test_parts_in_flight_are_shown_and_counted() -> None:
    """A multi-node checkpoint whose part this host stored shows in /status and `traind
    status` with the nodes in and missing, and traind_parts_missing counts the missing."""
    waiting = {"checkpoint-4": WaitingParts(4, 1, (1,), (0, 2)),
               "checkpoint-2": WaitingParts(2, 1, (0, 1), (2,))}
    streamer: Any = SimpleNamespace(queued=0, current=None, held={}, claim_ttl=600.0,
                                    waiting_parts=waiting)
    observer = Observer("run", streamer, lambda: "local", lambda: 0)
    status = observer.snapshot()
    assert [(p["tag"], p["present"], p["missing"]) for p in status["parts"]] == [
        ("checkpoint-2", [0, 1], [2]), ("checkpoint-4", [1], [0, 2])]
    assert samples(observer, "traind_parts_missing") == {(): 3}
    assert ("parts      checkpoint-4: this node (1) stored; nodes 1 in, 0, 2 missing "
            "(not committed yet)") in render(status)
    waiting.clear()
    assert samples(observer, "traind_parts_missing") == {(): 0}


def test_a_wait_for_the_resume_point_is_shown() -> None:
    """A host waiting for the job's resume point shows in /status and `traind status` with
    the nodes node 0 still misses (or that node 0 has not counted it yet); none when done."""
    joint: Any = SimpleNamespace(waiting=Waiting(1, "nonce", 100.0, (0, 2)))
    observer = Observer("run", idle_streamer(), lambda: "local", lambda: 0)
    assert observer.snapshot()["resume"] is None
    observer.joint = joint
    status = observer.snapshot()
    assert status["resume"] == {"node_rank": 1, "since": 100.0, "missing": [0, 2]}
    assert ("resume     node 1 waits 20s for the resume point every node starts from (nodes "
            "0, 2 missing)") in render(status, now=120.0)
    joint.waiting = Waiting(1, "nonce", 100.0, None)
    assert "node 0 has not counted this node's request yet" in render(observer.snapshot())
    joint.waiting = None
    assert observer.snapshot()["resume"] is None


def test_checkpoint_life_from_the_log_events() -> None:
    """checkpoint_staged and checkpoint_complete build the timeline; a commit makes it safe
    and observes its save-to-safe seconds; the save cadence and the unsafe age are scraped."""
    streamer = idle_streamer()
    observer = Observer("run", streamer, lambda: "s3", lambda: 0)
    log = observer.recent.processor
    for step in (1, 2):
        log(None, "info", {"event": "checkpoint_staged", "tag": f"checkpoint-{step}",
                           "step": step, "bytes": 10, "since_last_write": 0.5})
        log(None, "info", {"event": "checkpoint_complete", "tag": f"checkpoint-{step}"})
    log(None, "info", {"event": "checkpoint_staged", "tag": "bad"})  # missing fields: ignored
    assert [e["stage"] for e in observer.snapshot()["timeline"]] == ["queued", "queued"]
    assert samples(observer, "traind_newest_checkpoint_unsafe_seconds")[()] >= 0.5
    assert set(samples(observer, "traind_save_interval_seconds")) == {()}  # two saves seen
    observer.committed(Manifest("run", "checkpoint-2", 2, (), writer=W))
    assert observer.snapshot()["timeline"][-1]["stage"] == "committed"
    assert samples(observer, "traind_newest_checkpoint_unsafe_seconds") == {(): 0.0}
    assert samples(observer, "traind_save_to_safe_seconds_count") == {(): 1}
    assert samples(observer, "traind_seconds_since_last_save")[()] >= 0.5


def test_hangs_are_counted_by_child() -> None:
    """vllm_hung and trainer_hung count as hangs of the child that logged them."""
    observer = Observer("run", idle_streamer(), lambda: "s3", lambda: 0)
    observer.recent.processor(None, "error", {"event": "vllm_hung", "child": "vllm"})
    observer.recent.processor(None, "error", {"event": "trainer_hung", "child": "trainer"})
    observer.recent.processor(None, "error", {"event": "vllm_hung", "child": "vllm"})
    assert samples(observer, "traind_child_hangs_total") == {
        (("child", "vllm"),): 2, (("child", "trainer"),): 1,
    }


def test_the_next_prune_is_shown_with_its_reasons() -> None:
    """/status lists what retention would delete from the store now, and only on the host
    that prunes it."""
    stored = [Manifest("run", f"checkpoint-{n}", n, (), writer=W) for n in (1, 2, 3)]
    policy = RetentionConfig(keep_last=2, keep_best=False)
    unknown = Observer("run", idle_streamer(), lambda: "s3", lambda: 0)
    pruning = Observer("run", idle_streamer(), lambda: "s3", lambda: 0,
                       retention=lambda: policy)
    elsewhere = Observer("run", idle_streamer(), lambda: "s3", lambda: 0,
                         retention=lambda: policy, prunes_remote=False)
    for observer in (unknown, pruning, elsewhere):
        observer.known(stored)
    assert unknown.snapshot()["prune"] == []  # no policy known
    assert pruning.snapshot()["prune"] == [
        {"tag": "checkpoint-1", "step": 1, "reason": "older than the last 2"}]
    assert elsewhere.snapshot()["prune"] == []
