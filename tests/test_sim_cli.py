"""`gpupool simulate`: the JSON contract, clear errors for bad CSV, and a real-trace smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OPENB = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared")) / "data" / "openb"
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,96000,786432,8,G2\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time\n"
    "p0,4000,8192,1,500,,LS,Running,0,100,0\n"
    "p1,8000,8192,2,1000,G2,LS,Running,10,50,10\n"
    "p2,2000,4096,0,0,,BE,Running,20,30,20\n"
    "p3,4000,8192,1,250,T4|G2,LS,Running,30,200,30\n"
)


def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.wiring.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def write(tmp: Path, nodes: str = NODES, pods: str = PODS) -> tuple[str, str]:
    (tmp / "nodes.csv").write_text(nodes)
    (tmp / "pods.csv").write_text(pods)
    return str(tmp / "nodes.csv"), str(tmp / "pods.csv")


def test_fgd_scenario_writes_the_json_contract(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path)
    out = tmp_path / "r.json"
    r = simulate(
        "fgd",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "best-fit",
        "--inflation",
        "1.3",
        "--seed",
        "42",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert {"policy", "seed", "arrived_pct", "alloc_ratio_pct", "unallocated_gpus", "wall_s"} <= set(result)
    assert len(result["arrived_pct"]) == len(result["alloc_ratio_pct"])
    assert result["policy"] == "best-fit" and result["seed"] == 42
    assert "GPUs allocated:" in r.stdout and f"JSON: {out}" in r.stdout  # a summary for the person running it


def test_replay_scenario_reports_time_averages(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path)
    r = simulate("replay", "--nodes", nodes, "--pods", pods, "--json", "-")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["pods"] == 4 and result["rejected"] == 0
    # 10 GPUs; 0.5 for 0..100, 2 for 10..50, 0.25 for 30..200 -> time average over 0..200
    expected = (500 * 100 + 2000 * 40 + 250 * 170) / 200 / 10000 * 100
    assert result["time_avg_alloc_pct"] == pytest.approx(expected, abs=0.01)
    assert {"queue_delay_p50_s", "queue_delay_p99_s", "time_avg_fragmented_gpus"} <= set(result)


@pytest.mark.parametrize(
    "which, text, expected",
    [
        (
            "pods",
            PODS.replace("p1,8000", "p1,lots"),
            "pods.csv:3: column cpu_milli: not a whole number: 'lots'",
        ),
        (
            "pods",
            PODS.replace("p0,4000,8192,1,500", "p0,4000,8192,9,500"),
            "pods.csv:2: column num_gpu: must be between 0 and 8, got 9",
        ),
        (
            "pods",
            PODS.replace("p1,8000,8192,2,1000", "p1,8000,8192,2,500"),
            "pods.csv:3: columns num_gpu/gpu_milli",
        ),
        ("pods", "name,cpu_milli\np0,1\n", "pods.csv:1: missing column(s) memory_mib, num_gpu, gpu_milli"),
        ("nodes", NODES.replace("n1,96000", "n1,-5"), "nodes.csv:3: column cpu_milli: must be >= 0, got -5"),
    ],
)
def test_malformed_csv_names_file_line_and_column(
    tmp_path: Path, which: str, text: str, expected: str
) -> None:
    nodes, pods = write(tmp_path, **{which: text})
    r = simulate("fgd", "--nodes", nodes, "--pods", pods)
    assert r.returncode == 2
    assert expected in r.stderr and "Traceback" not in r.stderr


def test_a_trace_without_time_columns_cannot_replay_and_says_so(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path, pods="name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\n")
    r = simulate("replay", "--nodes", nodes, "--pods", pods)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "replay needs creation_time and deletion_time columns" in r.stderr and "pods.csv" in r.stderr


def test_the_documented_commands_run_on_the_sample_trace_from_a_clone(tmp_path: Path) -> None:
    from gpupool.sim.sample import write as make_sample

    make_sample(tmp_path)  # the committed sample is exactly what the generator makes
    for name in ("nodes.csv", "pods.csv"):
        assert (tmp_path / name).read_text() == (REPO / "docs" / "sample-trace" / name).read_text()
    sample = ("--nodes", "docs/sample-trace/nodes.csv", "--pods", "docs/sample-trace/pods.csv")
    r = simulate("fgd", *sample, "--policy", "frag-aware", "--inflation", "1.3", "--seed", "42")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "gpupool simulate fgd: policy frag-aware, seed 42, 97 pods"
    assert (
        lines[1].startswith("  GPUs allocated: ")
        and "% of capacity when 129 % of it had been requested" in lines[1]
    )
    r = simulate("replay", *sample, "--queue")
    assert r.returncode == 0 and "GPU allocation, time average:" in r.stdout, r.stderr


def test_help_lists_policies_and_scenarios() -> None:
    r = simulate("--help")
    assert r.returncode == 0
    for word in ("fgd", "replay", "frag-aware", "best-fit", "random", "spread", "gpu-packing", "first-fit"):
        assert word in r.stdout


@pytest.mark.skipif(not OPENB.exists(), reason="shared openb data not present")
def test_smoke_on_a_slice_of_the_real_trace(tmp_path: Path) -> None:
    nodes = (OPENB / "openb_node_list_gpu_node.csv").read_text().splitlines()
    pods = (OPENB / "openb_pod_list_default.csv").read_text().splitlines()
    n, p = write(tmp_path, "\n".join(nodes[:121]) + "\n", "\n".join(pods[:801]) + "\n")
    results = {}
    for policy in ("frag-aware", "random"):
        r = simulate("fgd", "--nodes", n, "--pods", p, "--policy", policy, "--json", "-")
        assert r.returncode == 0, r.stderr
        results[policy] = json.loads(r.stdout)["alloc_ratio_pct"][-1]
    assert results["frag-aware"] > results["random"]  # packing beats chance even on a slice
