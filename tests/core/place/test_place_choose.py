"""lokid.core.place.choose: which GPUs a start of a ``gpus = "auto"`` / ``gpu_count``
preset gets. The room figures are those of the recorded H200 (shared/recipes: 143155 MiB,
142629 MiB free before any engine), four of them as on an 8×H200 host's half."""

from __future__ import annotations

from lokid.core.place.choose import choose
from lokid.core.place.policy import HOST

MiB, GiB = 2**20, 2**30
FREE = 142629 * MiB


def test_the_best_fit_leaves_the_largest_rooms_whole() -> None:
    room = {"GPU0": FREE, "GPU1": 30 * GiB, "GPU2": 20 * GiB, "GPU3": FREE - 100 * GiB,
            HOST: 500 * GiB}
    c = choose(1, 18 * GiB, room)
    assert c.gpus == ("GPU2",) and c.visible() == "2" and c.fits
    assert c.why == ("GPUs chosen: GPU2 (needs 18.0 GiB; GPU2 has 20.0 GiB free; the best "
                     "fit of 4 GPUs)")
    # two of them: the two smallest that hold it, named by index
    c2 = choose(2, 25 * GiB, room)
    assert c2.gpus == ("GPU1", "GPU3") and c2.visible() == "1,3"
    assert "needs 25.0 GiB each" in c2.why


def test_too_little_room_now_takes_the_most_free_and_says_it_may_fail() -> None:
    room = {"GPU0": 10 * GiB, "GPU1": 12 * GiB, "GPU2": 3 * GiB}
    c = choose(2, 40 * GiB, room, claimed={"GPU0": 8 * GiB, "GPU2": 0})
    assert c.gpus == ("GPU0", "GPU1") and not c.fits
    assert "the engine may fail to load" in c.why
    assert c.why.endswith("counted as taken by starts still loading: 8.0 GiB on GPU0")


def test_nothing_to_choose_from() -> None:
    assert choose(1, GiB, {HOST: 64 * GiB}).gpus == ()
    assert choose(0, GiB, {"GPU0": FREE}).gpus == ()
    assert "no GPU to choose from" in choose(1, GiB, {}).why


def test_ties_go_to_the_lowest_index() -> None:
    room = {"GPU10": 20 * GiB, "GPU2": 20 * GiB, "GPU1": 20 * GiB}
    assert choose(1, GiB, room).gpus == ("GPU1",)
    assert choose(2, GiB, room).gpus == ("GPU1", "GPU2")


def test_a_replica_goes_apart_from_its_siblings_where_another_gpu_holds_it() -> None:
    """Issue 47: the GPUs of the preset's other replicas come last, not never."""
    room = {"GPU0": 10 * GiB, "GPU1": 3 * GiB, "GPU2": 20 * GiB}
    assert choose(1, 2 * GiB, room).gpus == ("GPU1",)                       # best fit
    apart = choose(1, 2 * GiB, room, avoid=frozenset({"GPU1"}))
    assert apart.gpus == ("GPU0",) and apart.why.endswith("apart from its replicas on GPU1")
    only = choose(1, 12 * GiB, room, avoid=frozenset({"GPU2"}))
    assert only.gpus == ("GPU2",) and only.fits
    assert only.why.endswith("beside its replicas on GPU2: no other GPU holds it")
