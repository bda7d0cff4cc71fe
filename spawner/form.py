"""The spawn form: pure rendering (from a template packaged with gpupool, as kubespawner renders
its profile form) and parsing, so both are testable without a hub."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.hub.templating import render
from gpupool.pool import Holding, InvalidRequest, format_gpus, parse_gpus
from gpupool.pool.units import MILLI_PER_GPU, UnitError, gpus_number

FIELD = "gpus"
POOL_FIELD = "pool"  # optional: one of the node pools the user's groups may use
MAX_POOL_NAME = 63


def gpus_value(milli: int) -> str:
    """The form's value for a size, in GPUs like the REST API ('0.25', '2'), never milli-GPU."""
    return gpus_number(milli)


def free_slots(gpu_free: Sequence[Sequence[int]], milli: int) -> int:
    """How many workspaces of `milli` fit in the pool now (fractions on one GPU, whole GPUs on one node)."""
    if milli < MILLI_PER_GPU:
        return sum(f // milli for node in gpu_free for f in node if f > 0)
    need = milli // MILLI_PER_GPU
    return sum(sum(1 for f in node if f >= MILLI_PER_GPU) // need for node in gpu_free)


@dataclass(frozen=True)
class SizeChoice:
    """One size on the form: its value, whether the user may pick it, and why not."""

    value: str  # in GPUs, as the REST API takes them
    size: str  # said to the user: '0.25 GPU'
    fits: bool  # within the quota left
    ok: bool  # may be picked now
    checked: bool
    facts: str  # memory, room in the pool now, what starting it takes


def render_form(
    offered: Sequence[tuple[int, bool]],
    held: Sequence[Holding],
    quota_milli: int,
    virtual: bool,
    *,
    memory_mib_per_gpu: int = 0,
    gpu_free: Sequence[Sequence[int]] | None = None,
    max_workspaces: int = 0,
    this_server: str | None = None,
    pools: Sequence[str] = (),
    reclaim: Mapping[int, int] | None = None,
    moves: Mapping[int, int] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Radio buttons for the sizes the user's groups allow, each with its memory and how many
    would fit in the pool now; sizes over the quota left or without room are disabled with the
    reason, so nobody has to guess why. `held` is every server of the user (the one being
    started, `this_server`, does not count against its own form). `pools`: the node pools the
    user may use, in order of preference (`gpu_free` then shows only their GPUs); with more
    than one, the user may pick one. `reclaim`: for a size without free room, how many train
    jobs borrowing GPUs would be preempted to make it (build workspaces come first): such a size
    is offered, and says so; `moves`: likewise, how many idle notebooks would move to another
    GPU to make room (gpupool.parking.mover). `notes`: what the user should read first (a GPU-hour budget near or
    over its limit, a smaller size that would do). The markup is templates/gpupool-spawn-form.html."""
    others = [h for h in held if this_server is None or h.server_name != this_server]
    at_limit = bool(max_workspaces) and len(others) >= max_workspaces
    return render(
        "gpupool-spawn-form.html",
        field=FIELD,
        pool_field=POOL_FIELD,
        quota=format_gpus(quota_milli),
        used=format_gpus(sum(h.milli for h in others)),
        max_workspaces=max_workspaces,
        at_limit=at_limit,
        notes=list(notes),
        virtual=virtual,
        others=[{"label": h.label, "size": format_gpus(h.milli)} for h in others],
        choices=size_choices(offered, memory_mib_per_gpu, gpu_free, at_limit, reclaim or {}, moves or {}),
        pools=list(pools),
        pools_listed=", ".join(pools),
    )


def size_choices(
    offered: Sequence[tuple[int, bool]],
    memory_mib_per_gpu: int,
    gpu_free: Sequence[Sequence[int]] | None,
    at_limit: bool,
    reclaim: Mapping[int, int],
    moves: Mapping[int, int],
) -> list[SizeChoice]:
    """Which sizes may be picked and why not; the first that may is checked."""
    choices, first = [], True
    for milli, fits in offered:
        room = free_slots(gpu_free, milli) if gpu_free is not None else None
        freed = reclaim.get(milli) if room == 0 else None
        moved = moves.get(milli) if room == 0 and freed is None else None
        ok = fits and (room != 0 or freed is not None or moved is not None) and not at_limit
        facts = []
        if memory_mib_per_gpu:
            facts.append(f"{memory_mib_per_gpu * milli // MILLI_PER_GPU:,} MiB")
        if freed is not None:
            facts.append(reclaim_text(freed))
        elif moved is not None:
            facts.append(moves_text(moved))
        elif room is not None:
            facts.append(f"room for {room} now" if room else "no room in the pool now")
        choices.append(
            SizeChoice(gpus_value(milli), format_gpus(milli), fits, ok, ok and first, ", ".join(facts))
        )
        first = first and not ok
    return choices


def reclaim_text(jobs: int) -> str:
    """What starting a size takes when only build-first makes room for it."""
    if not jobs:
        return "room is being freed: a train job is stopping"
    return (
        f"no free room: starting it stops {jobs} train job{'s' if jobs > 1 else ''} borrowing idle GPUs,"
        " as build workspaces come first"
    )


def moves_text(notebooks: int) -> str:
    """What starting a size takes when only moving idle notebooks makes room for it."""
    return (
        f"no free room: starting it first moves {notebooks} idle notebook{'s' if notebooks > 1 else ''}"
        " to another GPU (seconds; nothing in them restarts)"
    )


def parse_form(formdata: Mapping[str, list[str]]) -> dict[str, str]:
    """Form fields -> user_options. Only the GPU size and the node pool are taken; anything
    else is ignored."""
    values = formdata.get(FIELD) or []
    if len(values) != 1:
        raise InvalidRequest("choose one GPU size on the form")
    options = {FIELD: values[0].strip()}  # GPUs, as the REST API takes them
    pools = formdata.get(POOL_FIELD) or []
    if len(pools) > 1:
        raise InvalidRequest("choose one node pool on the form")
    if pools and pools[0].strip():
        options[POOL_FIELD] = pools[0].strip()
    return options  # its values' bounds: parse_choice, run on it next


@dataclass(frozen=True)
class SpawnChoice:
    """The user's options (the spawn form's or a REST API body), parsed once when JupyterHub
    applies them: what every later step of the spawn reads, never the raw options again."""

    milli: int  # the GPU share asked for; 0 with a profile list (the chosen profile gives it)
    pool: str | None  # one of the user's node pools, None for any of theirs
    profile: str | None = None  # with a profile list: the slug asked for, None for the default


def parse_choice(user_options: Mapping[str, object], *, profiles: bool = False) -> SpawnChoice:
    """user_options -> SpawnChoice, or InvalidRequest saying what is wrong. `profiles`: the
    spawner offers a profile list (kubespawner's form), so the size is the profile's, read
    against the user's offer when the share is reserved."""
    if profiles:
        profile = user_options.get("profile", "") if isinstance(user_options, Mapping) else ""
        if not isinstance(profile, str):
            raise InvalidRequest("user option 'profile' must be a profile's slug")
        return SpawnChoice(0, _requested_pool(user_options), profile or None)
    return SpawnChoice(_requested_milli(user_options), _requested_pool(user_options))


def _requested_pool(user_options: Mapping[str, object]) -> str | None:
    """The node pool asked for (form or REST API), None for any of the user's; its bounds
    here, whether the user may use it where the share is reserved."""
    pool = user_options.get(POOL_FIELD) if isinstance(user_options, Mapping) else None
    if pool is None or pool == "":
        return None
    if not isinstance(pool, str) or len(pool) > MAX_POOL_NAME:
        raise InvalidRequest(
            f"user option '{POOL_FIELD}' must be the name of a node pool"
            f' (at most {MAX_POOL_NAME} characters), e.g. {{"{POOL_FIELD}": "workstations"}}'
        )
    return pool


def _requested_milli(user_options: Mapping[str, object]) -> int:
    """user_options (from the form or the REST API) -> milli-GPU, with a clear error."""
    if not isinstance(user_options, Mapping):
        raise InvalidRequest(f'user options must be an object, e.g. {{"{FIELD}": 0.25}}')
    if FIELD not in user_options:
        raise InvalidRequest(f"say how many GPUs you want: user option '{FIELD}', e.g. {{\"{FIELD}\": 0.25}}")
    try:
        milli = parse_gpus(user_options[FIELD])
    except UnitError as err:
        raise InvalidRequest(str(err)) from None
    if milli <= 0:
        raise InvalidRequest(f"ask for more than 0 GPU, got {format_gpus(milli)}")
    return milli
