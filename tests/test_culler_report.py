"""The culler's report is checked whole before the hub keeps any of it (the pages, the home page
warnings and the notebook widgets read what it keeps): a malformed one is refused with the first
problem in plain words."""

from __future__ import annotations

import pytest

from gpupool.api.culler import DEFAULTS, parse_report


def test_a_good_report_is_kept_with_every_key_the_pages_read() -> None:
    when, workspaces, events = parse_report(
        {
            "pass_time": 5,
            "workspaces": [{"owner": "ann", "action": "warn", "message": "m" * 5000, "extra": 1}],
            "events": [{"kind": "cull", "owner": "ann", "name": "", "message": "stopped"}],
        },
        now=1,
    )
    assert when == 5.0
    assert workspaces == [{**DEFAULTS, "owner": "ann", "name": "", "action": "warn", "message": "m" * 2000}]
    assert events == [{"kind": "cull", "owner": "ann", "name": "", "message": "stopped", "reason": ""}]


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"pass_time": "now"}, "pass_time"),
        ({"pass_time": True}, "pass_time"),
        ({"workspaces": {"ann/": {}}}, "workspaces must be a list"),
        ({"workspaces": ["ann"]}, "workspaces must be a list"),
        ({"workspaces": [{"owner": ""}]}, "workspaces[0].owner"),
        ({"workspaces": [{"owner": "ann", "name": 3}]}, "workspaces[0].name"),
        ({"workspaces": [{"owner": "ann", "gpu_util_pct": "high"}]}, "gpu_util_pct must be a number"),
        ({"workspaces": [{"owner": "ann", "memory_mib": 1e300}]}, "memory_mib must be a number"),
        ({"workspaces": [{"owner": "ann", "extended": 1}]}, "extended must be true or false"),
        ({"workspaces": [{"owner": "ann", "action": "explode"}]}, "workspaces[0].action"),
        ({"events": [{"kind": "warn", "owner": "x" * 256}]}, "events[0].owner"),
        ({"events": [{"kind": "reboot", "owner": "ann"}]}, "events[0].kind"),
        ({"events": [{"kind": "warn", "owner": "ann", "message": ["a"]}]}, "events[0].message"),
        ({"events": [{"kind": "cull", "owner": "ann", "idle_s": -1}]}, "events[0].idle_s"),
        ({"events": [{"kind": "cull", "owner": "ann", "idle_s": "long"}]}, "events[0].idle_s"),
        ({"events": [{"kind": "cull", "owner": "ann", "idle_s": 1e300}]}, "events[0].idle_s"),
        (
            {"workspaces": [{"owner": "ann", "extended_cull_at": "later"}]},
            "extended_cull_at must be a number",
        ),
    ],
)
def test_a_malformed_report_is_refused_with_its_first_problem(body: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_report(body, now=1)
