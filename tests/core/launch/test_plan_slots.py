"""lokid.core.launch.plan: ``--slot-save-path`` for a preset in a GPU group (issue 22, item 7)."""

from __future__ import annotations

from support.engine_data import caps_without
from test_plan import inputs, preset

from lokid.core.launch.plan import build_plan
from lokid.core.serve.tables import Serve

GROUP = Serve(on_demand=True, group="gpu0")
SLOTS = "/var/lib/loki/slots/p"


def test_a_preset_in_a_group_saves_its_slots_in_the_state_directory() -> None:
    plan = build_plan(inputs(preset(serve=GROUP, extra_args=("-np", "4")), slot_dir=SLOTS))
    # before extra_args: the operator's flags come last
    assert plan.argv[-4:] == ("--slot-save-path", SLOTS + "/", "-np", "4")
    assert any(n.startswith(f"serve.group = gpu0: --slot-save-path {SLOTS}/: before a swap "
                            "stops it, the gateway saves its slots") for n in plan.notes)


def test_no_slot_save_path_without_a_group_or_a_known_directory() -> None:
    for p, slot_dir in ((preset(), SLOTS), (preset(serve=Serve(on_demand=True)), SLOTS),
                        (preset(serve=GROUP), "")):
        plan = build_plan(inputs(p, slot_dir=slot_dir))
        assert "--slot-save-path" not in plan.argv
        assert not any("slot" in n for n in plan.notes), plan.notes


def test_the_operators_own_path_wins_and_an_engine_without_the_flag_is_said() -> None:
    own = build_plan(inputs(preset(serve=GROUP, extra_args=("--slot-save-path", "/srv/s")),
                            slot_dir=SLOTS))
    assert own.argv.count("--slot-save-path") == 1 and own.argv[-1] == "/srv/s"
    assert "extra_args sets --slot-save-path: the gateway saves the slots there before a " \
           "swap and restores them after" in own.notes
    old = build_plan(inputs(preset(serve=GROUP), slot_dir=SLOTS,
                            caps=caps_without("--slot-save-path")))
    assert "--slot-save-path" not in old.argv
    assert "serve.group = gpu0: this engine does not know --slot-save-path, so a swap " \
           "loses the slots' prompt caches" in old.notes
