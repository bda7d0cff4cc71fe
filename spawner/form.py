"""The spawn form: pure rendering and parsing, so both are testable without a hub."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from html import escape

from gpupool.pool import Holding, InvalidRequest, format_gpus, parse_gpus
from gpupool.pool.units import MILLI_PER_GPU, UnitError

FIELD = "gpus"
POOL_FIELD = "pool"  # optional: one of the node pools the user's groups may use
MAX_POOL_NAME = 63


def gpus_value(milli: int) -> str:
    """The form's value for a size, in GPUs like the REST API ('0.25', '2'), never milli-GPU."""
    return format(Decimal(milli) / MILLI_PER_GPU, "f").rstrip("0").rstrip(".") if milli % MILLI_PER_GPU \
        else str(milli // MILLI_PER_GPU)


def free_slots(gpu_free: Sequence[Sequence[int]], milli: int) -> int:
    """How many workspaces of `milli` fit in the pool now (fractions on one GPU, whole GPUs on one node)."""
    if milli < MILLI_PER_GPU:
        return sum(f // milli for node in gpu_free for f in node if f > 0)
    need = milli // MILLI_PER_GPU
    return sum(sum(1 for f in node if f >= MILLI_PER_GPU) // need for node in gpu_free)


def render_form(offered: Sequence[tuple[int, bool]], held: Sequence[Holding], quota_milli: int,
                virtual: bool, *, memory_mib_per_gpu: int = 0, gpu_free: Sequence[Sequence[int]] | None = None,
                max_workspaces: int = 0, this_server: str | None = None, pools: Sequence[str] = (),
                reclaim: Mapping[int, int] | None = None, moves: Mapping[int, int] | None = None,
                notes: Sequence[str] = ()) -> str:
    """Radio buttons for the sizes the user's groups allow, each with its memory and how many
    would fit in the pool now; sizes over the quota left or without room are disabled with the
    reason, so nobody has to guess why. `held` is every server of the user (the one being
    started, `this_server`, does not count against its own form). `pools`: the node pools the
    user may use, in order of preference (`gpu_free` then shows only their GPUs); with more
    than one, the user may pick one. `reclaim`: for a size without free room, how many train
    jobs borrowing GPUs would be preempted to make it (build workspaces come first): such a size
    is offered, and says so; `moves`: likewise, how many idle notebooks would move to another
    GPU to make room (gpupool.mover). `notes`: what the user should read first (a GPU-hour budget near or
    over its limit, a smaller size that would do)."""
    others = [h for h in held if this_server is None or h.server_name != this_server]
    used = sum(h.milli for h in others)
    lines = [
        '<div class="form-group gpupool-form">',
        f'<p class="gpupool-quota">Your build quota: <b>{format_gpus(quota_milli)}</b>;'
        f" in use: <b>{format_gpus(used)}</b>"
        + (f'; workspaces <b class="gpupool-workspaces">{len(others)} of {max_workspaces}</b>' if max_workspaces else "")
        + ".</p>",
    ]
    lines += [f'<p class="gpupool-note alert alert-info">{escape(n)}</p>' for n in notes]
    if others:
        items = "".join(f"<li>{escape(h.label)}: {format_gpus(h.milli)}</li>" for h in others)
        lines.append(f'<ul class="gpupool-held">{items}</ul>')
    if max_workspaces and len(others) >= max_workspaces:
        lines.append(f'<p class="gpupool-limit alert alert-warning">You run {len(others)} of {max_workspaces}'
                     " GPU workspaces allowed: stop one to start another.</p>")
    if virtual:
        lines.append('<p class="gpupool-virtual"><i>These GPUs are virtual (no NVIDIA GPU was found):'
                     " the workspace starts with the GPU settings but no real GPU.</i></p>")
    first = True
    for milli, fits in offered:
        room = free_slots(gpu_free, milli) if gpu_free is not None else None
        freed = (reclaim or {}).get(milli) if room == 0 else None
        moved = (moves or {}).get(milli) if room == 0 and freed is None else None
        ok = fits and (room != 0 or freed is not None or moved is not None) \
            and not (max_workspaces and len(others) >= max_workspaces)
        checked = " checked" if ok and first else ""
        first = first and not ok
        disabled = "" if ok else " disabled"
        facts = []
        if memory_mib_per_gpu:
            facts.append(f"{memory_mib_per_gpu * milli // MILLI_PER_GPU:,} MiB")
        if freed is not None:
            facts.append(reclaim_text(freed))
        elif moved is not None:
            facts.append(moves_text(moved))
        elif room is not None:
            facts.append(f"room for {room} now" if room else "no room in the pool now")
        note = "" if fits else " — over your quota left"
        detail = f' <small class="gpupool-facts">({", ".join(facts)})</small>' if facts else ""
        lines.append(
            f'<div class="radio"><label><input type="radio" name="{FIELD}" value="{gpus_value(milli)}"'
            f"{checked}{disabled}> {format_gpus(milli)}{detail}{note}</label></div>"
        )
    if not any(fits for _, fits in offered):
        lines.append('<p class="gpupool-none">No size fits your quota now: stop a running server first.</p>')
    lines.extend(pool_choice(pools))
    lines.append("</div>")
    return "\n".join(lines)


def reclaim_text(jobs: int) -> str:
    """What starting a size takes when only build-first makes room for it."""
    if not jobs:
        return "room is being freed: a train job is stopping"
    return (f"no free room: starting it stops {jobs} train job{'s' if jobs > 1 else ''} borrowing idle GPUs,"
            " as build workspaces come first")


def moves_text(notebooks: int) -> str:
    """What starting a size takes when only moving idle notebooks makes room for it."""
    return (f"no free room: starting it first moves {notebooks} idle notebook{'s' if notebooks > 1 else ''}"
            " to another GPU (seconds; nothing in them restarts)")


def pool_choice(pools: Sequence[str]) -> list[str]:
    """The node pools part of the form: one pool is said, several are offered (the first
    choice: any of them, in order of preference)."""
    if not pools:
        return []
    if len(pools) == 1:
        return [f'<p class="gpupool-pools">GPUs from node pool <b>{escape(pools[0])}</b>.</p>']
    lines = ['<fieldset class="gpupool-pools"><legend>Node pool</legend>',
             f'<div class="radio"><label><input type="radio" name="{POOL_FIELD}" value="" checked>'
             f' any of yours, in this order: {escape(", ".join(pools))}</label></div>']
    lines += [f'<div class="radio"><label><input type="radio" name="{POOL_FIELD}" value="{escape(p)}">'
              f" {escape(p)} only</label></div>" for p in pools]
    lines.append("</fieldset>")
    return lines


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
    requested_pool(options)
    return options


def requested_pool(user_options: Mapping[str, object]) -> str | None:
    """The node pool asked for (form or REST API), None for any of the user's; its bounds
    here, whether the user may use it where the share is reserved."""
    pool = user_options.get(POOL_FIELD) if isinstance(user_options, Mapping) else None
    if pool is None or pool == "":
        return None
    if not isinstance(pool, str) or len(pool) > MAX_POOL_NAME:
        raise InvalidRequest(f"user option '{POOL_FIELD}' must be the name of a node pool"
                             f" (at most {MAX_POOL_NAME} characters), e.g. {{\"{POOL_FIELD}\": \"workstations\"}}")
    return pool


def requested_milli(user_options: Mapping[str, object]) -> int:
    """user_options (from the form or the REST API) -> milli-GPU, with a clear error."""
    if not isinstance(user_options, Mapping):
        raise InvalidRequest(f"user options must be an object, e.g. {{\"{FIELD}\": 0.25}}")
    if FIELD not in user_options:
        raise InvalidRequest(f"say how many GPUs you want: user option '{FIELD}', e.g. {{\"{FIELD}\": 0.25}}")
    try:
        milli = parse_gpus(user_options[FIELD])
    except UnitError as err:
        raise InvalidRequest(str(err)) from None
    if milli <= 0:
        raise InvalidRequest(f"ask for more than 0 GPU, got {format_gpus(milli)}")
    return milli
