"""What the JupyterLab status item and its notification say (widgets/labextension/src/text.js),
run by Node as JupyterLab runs it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.hubtools import REPO

TEXT_JS = REPO / "widgets" / "labextension" / "src" / "text.js"


def run(expr: str):
    node = shutil.which("node")
    if not node:
        pytest.skip("node is not installed")
    script = f"import * as t from {json.dumps(TEXT_JS.as_uri())}; console.log(JSON.stringify({expr}));"
    out = subprocess.run(
        [node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_status_item_text() -> None:
    assert run("t.itemText({share: '0.25', cull_at: 4900, now: 1000})") == "GPU 0.25 · 1 h 5 min left"
    assert run("t.itemText({share: '0.5', cull_at: null, now: 1000})") == "GPU 0.5"
    assert run("t.itemText({share: '', now: 1})") == "no GPU"
    assert run("t.itemText({share: '0.25', parked: 'idle for 2 h', now: 1})") == "GPU 0.25 · parked"
    assert (
        run("t.itemTitle({lines: ['a'], stale: 'HTTP 502'})")
        == "gpupool\na\n(not updated just now: HTTP 502)"
    )
    assert run("t.itemText(null)") == "GPU …"  # reading: not "GPU ?", which says no answer came
    assert run("t.itemText({error: 'HTTP 502'})") == "GPU ?"


def test_the_warning_comes_from_the_culler_or_the_users_own_lead_time() -> None:
    soon = (
        "{cull_at: 2000, now: 1000, action: 'keep', reason: 'idle-gpu', reason_text: 'if its GPU stays idle',"
        " extendable: true}"
    )
    assert run(f"t.warning({soon}, 20)") == {
        "key": "warn:idle-gpu",
        "extendable": True,
        "message": "This server stops in 16 min if its GPU stays idle: save your work.",
    }
    assert run(f"t.warning({soon}, 10)") is None  # 16 min left, warn 10 min before: not yet
    culler = "{cull_at: 9000, now: 1000, action: 'warn', reason: 'max-age', message: 'will stop in 133 min'}"
    assert run(f"t.warning({culler}, 10)")["message"] == "This server will stop in 133 min"
    assert run("t.warning({error: 'x'}, 10)") is None


def test_one_notification_per_warning_updated_in_place_and_closed_when_it_no_longer_applies() -> None:
    """The culler's end time moves a few seconds at each of its passes: the same warning, new words
    in the notification already on screen, not a new one each time (12 stacked in 3 minutes)."""
    warn = (
        "{{cull_at: {at}, now: 1000, action: 'warn', reason: 'idle-gpu', message: 'will stop in {m} min',"
        " extendable: true}}"
    )
    first = run(f"t.notices({warn.format(at=1480, m=8)}, 15)")["warning"]
    moved = run(f"t.notices({warn.format(at=1487, m=8)}, 15)")["warning"]
    assert first["key"] == moved["key"] == "warn:idle-gpu" and first["kind"] == "warning"
    assert run(f"t.noticeChange(null, {json.dumps(first)})") == "show"
    assert run(f"t.noticeChange({json.dumps(first)}, {json.dumps(moved)})") == "none"
    later = run(f"t.notices({warn.format(at=1480, m=7)}, 15)")["warning"]
    assert run(f"t.noticeChange({json.dumps(first)}, {json.dumps(later)})") == "update"
    # extended (or the GPU in use again): nothing applies, the notification goes
    assert run("t.notices({cull_at: null, now: 1000, action: 'keep', extendable: false}, 15)") == {
        "warning": None,
        "info": None,
        "budget": None,
        "memory": None,
    }
    assert run(f"t.noticeChange({json.dumps(first)}, null)") == "dismiss"
    # parked: a notice of its own beside a warning (a parked session still ends at its time limit),
    # dismissed once the GPU is back
    both = run(
        "t.notices({cull_at: 1300, now: 1000, action: 'warn', reason: 'max-age', message: 'will stop in 5 min',"
        " parked: 'GPU parked — it comes back when you run a cell'}, 15)"
    )
    assert both["warning"]["key"] == "warn:max-age" and both["info"]["key"] == "parked"
    assert run("t.itemText({share: '', parked: 'x', now: 1})") == "GPU parked"
    assert run(f"t.noticeChange({json.dumps(both['info'])}, null)") == "dismiss"


def test_the_status_bar_says_where_a_moved_kernel_went_for_a_while() -> None:
    said = "moved to GPU 3 at 14:02 (to make room for a training job)"
    status = f"{{share: '0.5', cull_at: null, now: 2000, moved: {json.dumps(said)}, moved_at: 1900}}"
    assert run(f"t.itemText({status})") == f"GPU 0.5 · {said}"
    assert run(f"t.moved({status})") == {
        "key": "moved:1900",
        "message": f"Your kernel {said}. Nothing restarted.",
    }
    later = f"{{share: '0.5', cull_at: null, now: 1900 + 15 * 60, moved: {json.dumps(said)}, moved_at: 1900}}"
    assert run(f"t.itemText({later})") == "GPU 0.5"  # the tooltip keeps it; the bar goes back
    assert run(f"t.moved({later})") is None


def test_the_budget_and_a_queued_jobs_start_follow_the_share() -> None:
    near = (
        "{share: '0.25', now: 1, budget: {status: 'near', used_pct: 85, used_gpu_hours: 34.04,"
        " limit_gpu_hours: 40, message: '34 of 40 GPU-h used'}}"
    )
    assert run(f"t.itemText({near})") == "GPU 0.25 · budget 85 %"
    assert (
        run("t.itemText({share: '', now: 1, budget: {status: 'over', used_pct: 101, message: 'm'}})")
        == "no GPU · budget used up"
    )
    assert run("t.itemText({share: '0.5', now: 1, budget: {status: 'ok', used_pct: 10}})") == "GPU 0.5"
    assert run("t.itemText({share: '0.5', now: 1, job: {start: null}})") == "GPU 0.5 · job queued"
    assert run(f"t.budgetWarning({near})") == {
        "key": "budget:near",
        "message": "GPU-hour budget nearly used: 34 of 40 GPU-h (85 %). Over it, new work is refused.",
    }
    over = run("t.budgetWarning({budget: {status: 'over', used_gpu_hours: 41.25, limit_gpu_hours: 40}})")
    assert over == {
        "key": "budget:over",
        "message": "GPU-hour budget used up: 41.3 of 40 GPU-h. New work is refused; running work keeps running.",
    }
    timed = run(
        "t.budgetWarning({budget: {status: 'over', used_gpu_hours: 41, limit_gpu_hours: 40, frees_at: 1e9}})"
    )
    assert " until " in timed["message"] and len(timed["message"]) <= 140
    assert run("t.budgetWarning({budget: {status: 'ok'}})") is None
    assert run("t.budgetWarning({error: 'HTTP 502', budget: {status: 'over'}})") is None


def test_a_stopped_server_says_so_instead_of_http_424() -> None:
    """After a cull the open tab's `%gpupool` read "HTTP 424" and still offered Extend."""
    said = run("t.callError(424, null)")
    assert said["stopped"] and said["error"].startswith("This server is no longer running")
    assert "424" not in said["error"]
    assert run("t.callError(409, {message: 'extended already'})") == {
        "error": "extended already",
        "stopped": False,
    }


def test_a_process_killed_over_the_memory_limit_is_told_once_per_kill() -> None:
    """A kernel the OOM killer ended restarts with JupyterLab's bare "kernel died": the status says
    why, in a notification of its own, replaced when another process is killed."""
    one = run("t.notices({now: 1, memory_killed: 'killed: over its 600 MiB memory limit'}, 15)")["memory"]
    assert one["kind"] == "error" and one["message"].startswith(
        "A process of this server was killed: over its 600 MiB memory limit."
    )
    two = run("t.notices({now: 2, memory_killed: 'killed: over its 600 MiB memory limit (2 processes)'}, 15)")
    assert run(f"t.noticeChange({json.dumps(one)}, {json.dumps(two['memory'])})") == "replace"
    assert run(f"t.noticeChange({json.dumps(one)}, {json.dumps(one)})") == "none"  # polls say it once
    assert run("t.notices({now: 1, memory_killed: ''}, 15)")["memory"] is None
