"""What %gpupool, the job monitor and the JupyterLab status item say about GPU-hour budgets,
right-sizing and a queued job's estimated start: pure functions of the API's answers."""

from __future__ import annotations

from html.parser import HTMLParser

from gpupool.widgets.jobs import JobMonitor, job_row
from gpupool.widgets.status import budget_rows
from gpupool.widgets.summary import summary

ME = {"name": "ann", "build_quota_milli": 1000, "holdings": []}
POOL = {
    "gpus": [
        {
            "node": "n",
            "index": 0,
            "model": "virtual",
            "memory_mib": 16384,
            "virtual": True,
            "shares": [{"kind": "build", "owner": "ann", "name": "", "milli": 500}],
        }
    ]
}
OVER = {
    "status": "over",
    "message": "1.1 of 1 GPU-h used (110 %): the budget is used up",
    "budgets": [{"used_pct": 110}, {"used_pct": 20}],
    "rightsizing": {
        "suggested_gpus": 0.25,
        "message": "your last 3 sessions on 0.5 GPU used at most 900 MiB",
    },
}


def test_gpupool_shows_the_budget_and_a_smaller_size() -> None:
    rows = dict(budget_rows(OVER))
    assert rows["GPU-hour budget"] == "USED UP: 1.1 of 1 GPU-h used (110 %): the budget is used up"
    assert rows["Smaller size"].startswith("0.25 GPU would do: your last 3 sessions")
    assert budget_rows({"status": "none", "budgets": [], "rightsizing": None}) == []
    assert budget_rows(None) == []


def test_the_status_item_carries_the_budget_and_the_next_queued_job() -> None:
    jobs = {
        "jobs": [
            {
                "id": "j2",
                "name": "b",
                "state": "queued",
                "eta": {"start": 2000, "text": "starts around 10:33"},
                "wait_reason": "waiting for its turn",
            },
            {
                "id": "j1",
                "name": "a",
                "state": "queued",
                "eta": {"start": 1500, "text": "starts around 10:25"},
                "wait_reason": "waiting for GPUs",
            },
        ]
    }
    s = summary(ME, POOL, None, "", 1000, budget=OVER, jobs=jobs)
    assert s["budget"]["status"] == "over" and s["budget"]["used_pct"] == 110  # the fullest of its budgets
    assert s["budget"]["message"] == OVER["message"]
    assert s["job"]["id"] == "j1" and s["job"]["queued"] == 2  # the one expected to start first
    assert "GPU-hour budget: 1.1 of 1 GPU-h used" in "\n".join(s["lines"])
    assert "train job j1 (a) queued: starts around 10:25; waiting for GPUs (2 queued)" in s["lines"]
    plain = summary(ME, POOL, None, "", 1000)
    assert plain["budget"] is None and plain["job"] is None


def test_the_job_monitor_says_when_a_queued_job_should_start() -> None:
    job = {
        "id": "abc",
        "name": "n",
        "project": "p",
        "gpus": 1,
        "state": "queued",
        "runs": 0,
        "preemptions": 0,
        "gpu": [],
        "message": "",
        "wait_reason": "waiting for GPUs: no node has a free GPU",
        "eta": {"start": 5000, "text": "starts around 14:20 (in 35 min), once job x of p is expected to end"},
    }
    row = job_row(job)
    assert "starts around 14:20 (in 35 min), once job x of p is expected to end; waiting for GPUs" in row
    assert "starts around" not in job_row({**job, "state": "running", "runs": 1})


class _Cells(HTMLParser):
    """The rows of the monitor's tables: each cell as (tag, style, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = 0
        self.rows: list[list[tuple[str, str, str]]] = []
        self._cell: list | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables += 1
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("th", "td"):
            self._cell = [tag, dict(attrs).get("style") or "", ""]

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[2] += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            self.rows[-1].append(tuple(self._cell))
            self._cell = None


def test_the_job_monitors_headers_stand_over_their_columns() -> None:
    """One table, its header row over the same columns as each job's row, header and cells aligned
    alike: before, the browser centred each header while the cells under it started at the left
    (and JupyterLab's rendered HTML pushes them right), so 'state' stood over a job's GPUs."""

    class Api:  # the answer of api/jobs, as the monitor reads it
        def get(self, path: str) -> dict:
            assert path == "api/jobs"
            queued = {"id": "j1", "name": "resnet", "project": "vision", "gpus": 0.5, "state": "queued"}
            queued |= {
                "runs": 0,
                "preemptions": 0,
                "gpu": [],
                "message": "",
                "wait_reason": "waiting for GPUs",
            }
            running = {**queued, "id": "j2", "state": "running", "runs": 1, "wait_reason": ""}
            return {"jobs": [queued, running | {"gpu": [{"node": "n1", "gpus": "0"}]}]}

    html = JobMonitor(client=Api(), follow=False).table.value  # type: ignore[arg-type]
    cells = _Cells()
    cells.feed(html)
    assert cells.tables == 1
    header, *jobs = cells.rows
    assert [c[2] for c in header] == ["job", "project", "GPUs", "state", "GPU", "runs", "note"]
    assert {c[0] for c in header} == {"th"} and len(jobs) == 2
    for row in jobs:
        assert {c[0] for c in row} == {"td"} and len(row) == len(header)
        for head, cell in zip(
            header, row, strict=True
        ):  # each header aligned as the cell under it, at its left
            assert "text-align:left" in head[1] and "text-align:left" in cell[1], (head, cell)
    assert jobs[1][4][2] == "n1 GPU 0" and jobs[0][3][2] == "queuedwaiting for GPUs"
