"""Sweeps: one job per combination, parameters injected, each run's final metrics; the pure
parsing with its bounds, the magic's option, and a real hub."""

from __future__ import annotations

import pytest

from gpupool.train.sweep import MAX_RUNS, SweepError, combinations, final_metrics
from gpupool.widgets.magics import train_args
from tests.hubtools import Hub
from tests.support.wait import until

J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.max_queued_per_user = 6
c.TrainPool.projects = {"vision": {"guarantee": 4}}
"""


def test_combinations_are_the_product_in_order_within_bounds() -> None:
    assert combinations({"lr": [0.1, 0.01], "batch": [32, 64]}) == [
        {"lr": 0.1, "batch": 32},
        {"lr": 0.1, "batch": 64},
        {"lr": 0.01, "batch": 32},
        {"lr": 0.01, "batch": 64},
    ]
    for bad in (
        {},
        [],
        {"lr": []},
        {"lr": 0.1},
        {"1x": [1]},
        {"lr": [float("nan")]},
        {"lr": [[1]]},
        {"lr": [None]},
        {"a": list(range(7)), "b": list(range(3))},
        {f"k{i}": [1] for i in range(9)},
    ):
        with pytest.raises(SweepError):
            combinations(bad)
    assert len(combinations({"a": list(range(5)), "b": list(range(4))})) == MAX_RUNS


def test_final_metrics_are_the_last_line_that_prints_some() -> None:
    lines = ["epoch 1 loss=0.9", "epoch 2 loss=0.5 acc: 0.81", "[cell 2/2] done in 0.1s", "saved"]
    assert final_metrics(lines) == {"loss": 0.5, "acc": 0.81}
    assert final_metrics(["nothing to see"]) == {}
    assert final_metrics(["x=1e-3 y=-2"]) == {"x": 0.001, "y": -2.0}


def test_the_magic_turns_sweep_options_into_the_request() -> None:
    args = train_args("--project vision --sweep lr=0.1,0.01 --sweep opt=adam,sgd -p epochs=3 --pool ws")
    assert args.sweep_spec == {"lr": [0.1, 0.01], "opt": ["adam", "sgd"]} and args.parameters == {"epochs": 3}
    assert args.pool == ["ws"]
    with pytest.raises(ValueError, match="lr needs values"):  # the widget's sweep field reads the same
        train_args("--project vision --sweep lr=")


def test_the_widgets_sweep_field_counts_the_jobs_it_would_submit() -> None:
    from gpupool.widgets.sweep import parse_sweep_field

    assert parse_sweep_field("lr=0.1,0.01 opt=adam,sgd,'a b'") == (
        {"lr": [0.1, 0.01], "opt": ["adam", "sgd", "a b"]},
        6,
    )
    assert parse_sweep_field("  ") == ({}, 1)
    for bad in ("x" * 5000, "lr=1,,2", "=1", "lr=[1]", "k=" + ",".join(map(str, range(17)))):
        with pytest.raises(SweepError):
            parse_sweep_field(bad)


@pytest.mark.hub
def test_a_sweep_on_a_real_hub_runs_each_combination_and_reports_its_metrics(tmp_path) -> None:
    from tests.conftest import require_chp

    require_chp()
    hub = Hub(state=tmp_path, extra_config=CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    try:
        token = hub.user_token("ada")
        code = "loss = 1 / (lr * batch)\nprint(f'final loss={loss:.4f} lr={lr}')"
        out = hub.api(
            "POST",
            J,
            {
                "project": "vision",
                "gpus": 1,
                "name": "grid",
                "code": code,
                "sweep": {"lr": [0.5, 0.25], "batch": [2, 4]},
            },
            token=token,
        )
        assert [j["name"] for j in out["jobs"]] == ["grid-1", "grid-2", "grid-3", "grid-4"]

        def ended() -> dict | None:
            sweep = hub.api("GET", f"/services/gpupool/api/sweeps/{out['sweep']}", token=token)
            return sweep if all(r["job"]["state"] in ("succeeded", "failed") for r in sweep["runs"]) else None

        sweep = until(ended, "every run of the sweep to end", timeout=120, every=0.5, detail=hub.tail)
        assert sweep["parameters"] == ["batch", "lr"]
        # the notebook's table of the runs, read from the same API
        from gpupool.widgets.client import Client
        from gpupool.widgets.sweep import SweepTable

        table = SweepTable(out["sweep"], Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", token))
        assert table.table.value.count("<tr>") == 5 and "<th>loss</th>" in table.table.value
        assert "<td>grid-4</td><td>succeeded</td><td>4</td><td>0.25</td><td>1</td>" in table.table.value
        got = {(r["parameters"]["lr"], r["parameters"]["batch"]): r["metrics"] for r in sweep["runs"]}
        assert got == {
            (lr, b): {"loss": round(1 / (lr * b), 4), "lr": lr} for lr in (0.5, 0.25) for b in (2, 4)
        }
        # another user does not see it; bounds and kinds are checked before anything is submitted
        status, _ = hub.api_error(
            "GET", f"/services/gpupool/api/sweeps/{out['sweep']}", token=hub.user_token("eve")
        )
        assert status == 404
        for body, why in (
            ({"script": "print(1)", "sweep": {"lr": [1]}}, "only for code or notebook"),
            ({"code": "1", "sweep": {"lr": list(range(7))}}, "at most 6"),
            ({"code": "1", "sweep": {"lr": "0.1"}}, "needs a list"),
            ({"code": "1", "pools": ["dgx"]}, "pools: a list of node pools of project vision"),
        ):
            status, message = hub.api_error("POST", J, {"project": "vision", "gpus": 1, **body}, token=token)
            assert status in (400, 429) and why in message, message
        assert len(hub.api("GET", J, token=token)["jobs"]) == 4
        projects = hub.api("GET", "/services/gpupool/api/projects", token=token)  # what --help lists
        assert projects["projects"][0]["pools"] == [] and projects["node_pools"] == {}
    finally:
        hub.stop()


def test_train_help_lists_projects_with_their_pools() -> None:
    from gpupool.widgets.magics import projects_text

    text = projects_text(
        [
            {"name": "vision", "guarantee_milli": 8000, "used_milli": 0, "pools": ["dgx", "ws"]},
            {"name": "teach", "guarantee_milli": 1000, "used_milli": 0, "pools": []},
        ]
    )
    vision, teach = (line for line in text.splitlines() if line.strip().startswith(("vision", "teach")))
    assert "8 GPUs guaranteed" in vision and "GPUs from dgx, ws" in vision
    assert "1 GPU guaranteed" in teach and "GPUs from" not in teach


def test_the_sweep_table_escapes_what_runs_printed() -> None:
    from gpupool.widgets.sweep import sweep_html

    page = sweep_html(
        {
            "parameters": ["tag"],
            "runs": [
                {
                    "job": {"name": "a-1", "state": "running"},
                    "parameters": {"tag": "<b>x</b>"},
                    "metrics": {"acc": 0.91234},
                },
                {"job": {"name": "a-2", "state": "queued"}, "parameters": {"tag": "y"}, "metrics": {}},
            ],
        }
    )
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "<td>0.9123</td>" in page and page.count("<tr>") == 3


def test_the_default_sweep_limit_fits_the_queue_and_a_bigger_sweep_says_which_limit() -> None:
    """Before, max_sweep_runs (32) was above max_queued_per_user (20): a 21-32 run sweep passed
    the sweep check and was refused with "you have 0 jobs waiting ... cancel one or wait"."""
    from gpupool.train.config import TrainPool
    from gpupool.train.volume import count_refusal

    cfg = TrainPool()
    assert cfg.max_sweep_runs <= min(cfg.max_queued_per_user, cfg.max_active_per_user)
    assert count_refusal([], "ann", "lab", cfg.max_sweep_runs, cfg) == ""  # the largest sweep allowed fits
    said = count_refusal([], "ann", "lab", 25, TrainPool(max_sweep_runs=32))
    assert said == (
        "this sweep has 25 runs and you have 0 jobs waiting; one user may have at most 20 waiting"
        " (c.TrainPool.max_queued_per_user): submit at most 20 runs now (fewer values), or cancel"
        " waiting jobs first"
    )
