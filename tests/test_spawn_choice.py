"""The user's spawn options parsed once (spawner/form.py parse_choice): each refusal says what
is wrong, and the spawn form and a REST API body asking the same thing give the same choice."""

from __future__ import annotations

import pytest

from gpupool.pool import InvalidRequest
from gpupool.spawner.form import SpawnChoice, parse_choice, parse_form


@pytest.mark.parametrize(
    "options, message",
    [
        (["gpus", 1], 'user options must be an object, e.g. {"gpus": 0.25}'),
        ({}, "say how many GPUs you want: user option 'gpus', e.g. {\"gpus\": 0.25}"),
        ({"pool": "dgx"}, "say how many GPUs you want"),
        ({"gpus": "lots"}, "not a GPU amount"),
        ({"gpus": 0.0001}, "not a whole number of milli-GPU"),
        ({"gpus": -1}, "ask for more than 0 GPU, got -1 GPU"),
        ({"gpus": 0}, "ask for more than 0 GPU, got 0 GPU"),
        ({"gpus": 1, "pool": ["dgx"]}, "user option 'pool' must be the name of a node pool (at most 63"),
        ({"gpus": 1, "pool": "x" * 64}, "must be the name of a node pool"),
        ({"gpus": 1, "pool": 7}, "must be the name of a node pool"),
    ],
)
def test_each_bad_option_is_refused_with_what_is_wrong(options: object, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_choice(options)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_the_form_and_the_rest_api_give_the_same_choice() -> None:
    form = parse_choice(parse_form({"gpus": [" 0.5 "], "pool": ["dgx"], "other": ["x"]}))
    assert form == parse_choice({"gpus": 0.5, "pool": "dgx"}) == parse_choice({"gpus": "0.50", "pool": "dgx"})
    assert form == SpawnChoice(milli=500, pool="dgx", profile=None)
    # no pool chosen (the form's "any of yours", or none in the body): any of the user's pools
    assert parse_choice(parse_form({"gpus": ["2"], "pool": [""]})) == parse_choice({"gpus": 2, "pool": ""})
    assert parse_choice({"gpus": 2}) == SpawnChoice(2000, None)


def test_with_a_profile_list_the_profile_is_chosen_and_the_size_comes_from_it() -> None:
    assert parse_choice({"profile": "quarter"}, profiles=True) == SpawnChoice(0, None, "quarter")
    # no profile (or an empty one): kubespawner's default profile
    assert (
        parse_choice({}, profiles=True)
        == parse_choice({"profile": ""}, profiles=True)
        == SpawnChoice(0, None)
    )
    for bad in (None, 3, ["quarter"]):
        with pytest.raises(InvalidRequest, match="user option 'profile' must be a profile's slug"):
            parse_choice({"profile": bad}, profiles=True)
    with pytest.raises(InvalidRequest, match="must be the name of a node pool"):
        parse_choice({"profile": "quarter", "pool": "x" * 64}, profiles=True)
