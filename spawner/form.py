"""The spawn form: pure rendering and parsing, so both are testable without a hub."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from gpupool.pool import Holding, InvalidRequest, format_gpus, parse_gpus
from gpupool.pool.units import UnitError

FIELD = "gpus"


def render_form(offered: Sequence[tuple[int, bool]], held: Sequence[Holding], quota_milli: int,
                virtual: bool) -> str:
    """Radio buttons for the sizes the user's groups allow; sizes over the quota left
    are shown disabled with the reason, so nobody has to guess why."""
    used = sum(h.milli for h in held)
    lines = [
        '<div class="form-group gpupool-form">',
        f'<p class="gpupool-quota">Your build quota: <b>{format_gpus(quota_milli)}</b>;'
        f" in use: <b>{format_gpus(used)}</b>.</p>",
    ]
    if held:
        items = "".join(f"<li>{escape(h.label)}: {format_gpus(h.milli)}</li>" for h in held)
        lines.append(f'<ul class="gpupool-held">{items}</ul>')
    if virtual:
        lines.append('<p class="gpupool-virtual"><i>These GPUs are virtual (no NVIDIA GPU was found):'
                     " the workspace starts with the GPU settings but no real GPU.</i></p>")
    first = True
    for milli, fits in offered:
        checked = " checked" if fits and first else ""
        first = first and not fits
        disabled = "" if fits else " disabled"
        note = "" if fits else " — over your quota left"
        lines.append(
            f'<div class="radio"><label><input type="radio" name="{FIELD}" value="{milli}"'
            f'{checked}{disabled}> {format_gpus(milli)}{note}</label></div>'
        )
    if not any(fits for _, fits in offered):
        lines.append('<p class="gpupool-none">No size fits your quota now: stop a running server first.</p>')
    lines.append("</div>")
    return "\n".join(lines)


def parse_form(formdata: Mapping[str, list[str]]) -> dict[str, str]:
    """Form fields -> user_options. Only the GPU size is taken; anything else is ignored."""
    values = formdata.get(FIELD) or []
    if len(values) != 1:
        raise InvalidRequest("choose one GPU size on the form")
    return {FIELD: f"{values[0].strip()}m"}


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
