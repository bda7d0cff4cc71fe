"""Why a queued job waits, as its owner reads it in the job monitor."""

from __future__ import annotations

from gpupool.train.waiting import wait_reason

FULL = [[0, 0, 0, 0], [0, 0, 0, 0]]  # two 4-GPU nodes, nothing free


def test_over_its_guarantee_with_jobs_ahead() -> None:
    assert wait_reason(1, 1000, "vision", 2000, -1, 2000, 1, FULL) == (
        "waiting for GPUs: no node has a free GPU; project vision uses 2 of its 2-GPU guarantee, so it waits"
        " for idle GPUs; 1 job ahead"
    )


def test_bigger_than_any_node_says_it_never_starts() -> None:
    assert wait_reason(8, 1000, "vision", 8000, -1, 0, 0, FULL).startswith(
        "waiting: no node has 8 GPUs (the largest has 4)"
    )


def test_within_the_guarantee_but_no_node_has_room() -> None:
    free = [[1000, 1000, 0, 0], [1000, 0, 0, -1]]
    assert wait_reason(4, 1000, "nlp", 4000, -1, 0, 0, free) == (
        "waiting: no node has 4 free GPUs; within its guarantee, project nlp gets GPUs back from jobs"
        " running beyond theirs"
    )
    assert "no node has a GPU with 0.5 free" in wait_reason(1, 500, "nlp", 4000, -1, 0, 0, [[250, 0]])


def test_at_its_limit_and_when_room_exists() -> None:
    free = [[1000, 1000, 1000, 1000]]
    assert wait_reason(2, 1000, "x", 1000, 3000, 2000, 0, free) == (
        "waiting for GPUs: project x uses 2 of its 3-GPU limit"
    )
    assert wait_reason(2, 1000, "x", 1000, -1, 0, 2, free) == "waiting for its turn; 2 jobs ahead"
    assert wait_reason(2, 1000, "x", 1000, -1, 0, 0, free) == "starting: GPUs are free"


def test_a_preemption_is_one_line_that_says_where_the_job_goes_on() -> None:
    import time

    from gpupool.train.waiting import preemption_text
    from gpupool.vocab.states import PreemptCause

    at = time.mktime((2026, 11, 23, 14, 2, 0, 0, 0, -1))
    saved = time.mktime((2026, 11, 23, 13, 55, 0, 0, 0, -1))
    # the words come from the event's fields (cause, project), never from the reason's wording
    assert preemption_text(
        at, PreemptCause.GUARANTEE, "reclaimed", saved, "queued", for_project="vision"
    ) == (
        "preempted at 14:02 so that project vision gets its guarantee back;"
        " resumes from the checkpoint saved at 13:55"
    )
    assert preemption_text(at, PreemptCause.BUILD, "a build workspace needs its GPU", None, "running") == (
        "preempted at 14:02 because a build workspace needs its GPU; restarted from the beginning: no checkpoint"
    )


def test_the_preemption_line_is_made_from_the_events_fields_not_its_words(tmp_path) -> None:
    """The job monitor's line reads the preempt event's `cause` and `for_project`: a message
    worded otherwise (or cut short) changes nothing; an event written before it had fields still
    reads as before."""
    from types import SimpleNamespace

    from gpupool.store import Store, TrainJob
    from gpupool.train.waiting import last_preemption
    from gpupool.vocab.states import JobEvent, PreemptCause

    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    pool = SimpleNamespace(store=store)
    job = TrainJob(id="j1", state="queued", preemptions=1, workdir=str(tmp_path / "none"))
    store.record(
        JobEvent.PREEMPT,
        "job j1 of lab preempted: (cut)",
        owner="ann",
        name="j1",
        cause=PreemptCause.GUARANTEE,
        for_project="paper",
        reason="(cut)",
    )
    assert "so that project paper gets its guarantee back; restarts from the beginning" in last_preemption(
        pool, job
    )
    store.record(
        JobEvent.PREEMPT,
        "job j1 of lab preempted: project vision needs its guarantee",
        owner="ann",
        name="j1",
        cause=PreemptCause.PRIORITY,
        for_project="vision",
        reason="a job of priority 5 in vision",
    )
    assert "because a job of priority 5 in vision;" in last_preemption(pool, job)
    store.record(
        JobEvent.PREEMPT,
        "job j1 of lab preempted: project vision needs its guarantee",
        owner="ann",
        name="j1",
    )  # an old database's event: no fields
    assert "so that project vision gets its guarantee back;" in last_preemption(pool, job)
