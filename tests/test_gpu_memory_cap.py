"""A share's GPU memory cap (gpupool.gpu.memory_cap): shares filled to their caps, each with its
CUDA context, never need more than the card really has, whatever the shares and the card."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.gpu.env import gpu_env
from gpupool.gpu.memory_cap import share_cap_mib, usable_mib
from gpupool.pool import GPU


def splits() -> st.SearchStrategy[list[int]]:
    """Shares of one GPU (milli) that add up to at most the whole GPU."""
    return st.lists(st.integers(1, 1000), min_size=1, max_size=40).filter(lambda ms: sum(ms) <= 1000)


@given(
    shares=splits(),
    total=st.integers(0, 200_000),
    reserved=st.integers(0, 4096),
    free=st.one_of(st.none(), st.integers(0, 200_000)),
    context=st.integers(0, 2048),
)
def test_shares_filled_to_their_caps_with_their_contexts_fit_the_card(
    shares, total, reserved, free, context
) -> None:
    caps = [share_cap_mib(m, total, reserved, free, context) for m in shares]
    assert all(c >= 0 for c in caps)
    # each share that holds anything holds it with its context; one that cannot hold its
    # context gets 0 (the caller says so) and so never allocates
    used = sum(c + context for c in caps if c > 0)
    assert used <= usable_mib(total, reserved, free) <= total


def test_four_quarters_of_an_h100_leave_room_for_four_contexts_and_the_reserve() -> None:
    caps = [share_cap_mib(250, 81559, reserved_mib=512, context_mib=500) for _ in range(4)]
    assert caps == [(81559 - 512) // 4 - 500] * 4
    assert sum(caps) + 4 * 500 + 512 <= 81559
    assert share_cap_mib(250, 81559) < 81559 // 4  # the old cap, share x total, overran the card
    assert share_cap_mib(1, 1000, context_mib=500) == 0  # too small to hold its own context


def test_the_workspace_environment_states_the_cap_with_the_reserve() -> None:
    gpu = GPU(index=0, uuid="GPU-a", model="H100", memory_mib=81559, reserved_mib=512)
    env = gpu_env([gpu], 250, context_mib=400)
    assert env["GPUPOOL_GPU_MEMORY_MIB"] == str((81559 - 512) // 4 - 400)
