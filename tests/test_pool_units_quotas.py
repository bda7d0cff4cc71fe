"""Units and fixed build quotas: exact arithmetic and refusals that say what to do."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.pool import BuildLimits, BuildQuotaPolicy, Holding, InvalidRequest, QuotaExceeded, Request
from gpupool.pool.units import UnitError, format_gpus, parse_gpus


@pytest.mark.parametrize("text, milli", [("0.25", 250), (0.1, 100), ("2", 2000), ("500m", 500), (1, 1000)])
def test_parse_gpus(text, milli) -> None:
    assert parse_gpus(text) == milli


@pytest.mark.parametrize("bad", ["abc", "0.0001", "nan", "inf", True, "", "1e"])
def test_parse_gpus_rejects_what_is_not_a_whole_milli_amount(bad) -> None:
    with pytest.raises(UnitError):
        parse_gpus(bad)


@given(st.lists(st.sampled_from([100, 250, 500]), max_size=40))
def test_integer_shares_sum_exactly(shares) -> None:
    # the reason for milli units: ten 0.1 shares are exactly one GPU
    assert sum(parse_gpus(format_gpus(s).split()[0]) for s in shares) == sum(shares)


def test_request_for_gpus_refuses_impossible_shapes() -> None:
    assert Request.for_gpus(250) == Request(num_gpu=1, gpu_milli=250)
    assert Request.for_gpus(2000) == Request(num_gpu=2, gpu_milli=1000)
    with pytest.raises(InvalidRequest, match="not a whole number of GPUs"):
        Request.for_gpus(1500)
    with pytest.raises(InvalidRequest, match="more than 0"):
        Request.for_gpus(-1000)
    with pytest.raises(InvalidRequest, match="fractions are for one GPU"):
        Request(num_gpu=2, gpu_milli=500)


POLICY = BuildQuotaPolicy(
    default=BuildLimits(500, (100, 250, 500), 500, 2),
    group_overrides={
        "research": BuildLimits(2000, (500, 1000, 2000), 2000, 3),
        "gpu-heavy": BuildLimits(1000, (1000,), 1000, 1),
    },
    group_totals_milli={"cs101": 1000},
)


def test_groups_give_the_most_generous_limits() -> None:
    limits = POLICY.limits_for(["research", "gpu-heavy"])
    assert limits == BuildLimits(2000, (500, 1000, 2000), 2000, 3)
    assert POLICY.limits_for([]) == POLICY.default
    assert POLICY.limits_for(["unknown"]) == POLICY.default


def test_offered_sizes_mark_what_fits_the_quota_left() -> None:
    held = [Holding("exp1", 250)]
    assert POLICY.offered_sizes([], held) == [(100, True), (250, True), (500, False)]


def test_refusal_names_the_server_that_holds_the_quota() -> None:
    with pytest.raises(QuotaExceeded) as err:
        POLICY.check(500, [], [Holding("exp1", 500)])
    assert str(err.value) == (
        "your build quota is 0.5 GPU and server 'exp1' holds 0.5 GPU: stop it or choose a smaller fraction"
    )


def test_refusals_for_size_count_and_group_total() -> None:
    with pytest.raises(
        InvalidRequest, match="not an offered size; choose one of: 0.1 GPU, 0.25 GPU, 0.5 GPU"
    ):
        POLICY.check(1000, [], [])
    with pytest.raises(QuotaExceeded, match="you may run 2 GPU workspace"):
        POLICY.check(100, [], [Holding("a", 100), Holding("b", 100)])
    with pytest.raises(QuotaExceeded, match="group 'cs101' may hold 1 GPU in all"):
        POLICY.check(250, ["cs101"], [], {"cs101": 900})
    POLICY.check(100, ["cs101"], [], {"cs101": 900})  # exactly at the group total is fine
