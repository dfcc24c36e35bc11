"""The probes that keep state of their own in the state directory (the inference canary's rotation cursor and
greedy-output stability, the SDC goldens) never read or write through a link planted there: the same
guarantee as the daemon's own state files (core/statefile), from probes/lib/safefile."""
from __future__ import annotations

import json
import os

from fleetcanary.probes import inference
from fleetcanary.probes.lib import sdc

VICTIM_TEXT = "precious\n"


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    return victim


def _targets(n: int) -> list[inference.Target]:
    return [inference.Target(name=f"t{i}", base_url="http://127.0.0.1:9/v1", model="m") for i in range(n)]


def test_the_rotation_cursor_is_not_written_through_planted_links(tmp_path):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    (state / "inference").mkdir(parents=True)
    for name in ("rotation.json", "rotation.tmp", f".rotation.json.{os.getpid()}.tmp"):
        (state / "inference" / name).symlink_to(victim)
    order = _targets(3)
    inference._advance(str(state), order, 1)
    assert victim.read_text() == VICTIM_TEXT
    cursor = state / "inference" / "rotation.json"
    assert not cursor.is_symlink() and json.loads(cursor.read_text()) == {"next": "t1"}
    assert [t.name for t in inference._rotated(order, str(state))] == ["t1", "t2", "t0"]


def test_a_planted_inference_directory_link_takes_no_write(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    (state / "inference").symlink_to(elsewhere)
    inference._advance(str(state), _targets(3), 1)
    assert inference._stability(str(state), _targets(1)[0], "an answer") is True
    assert list(elsewhere.iterdir()) == []


def test_a_linked_cursor_is_not_read(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"next": "t2"}))
    state = tmp_path / "state"
    (state / "inference").mkdir(parents=True)
    (state / "inference" / "rotation.json").symlink_to(outside)
    assert [t.name for t in inference._rotated(_targets(3), str(state))] == ["t0", "t1", "t2"]


def test_the_stability_record_is_not_written_through_a_planted_temporary(tmp_path):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    t = _targets(1)[0]
    assert inference._stability(str(state), t, "first answer") is True   # the first one is recorded
    (record,) = (state / "inference").glob("*.json")
    record.unlink()
    record.with_suffix(".tmp").symlink_to(victim)                          # the old temporary's name
    assert inference._stability(str(state), t, "second answer") is True
    assert victim.read_text() == VICTIM_TEXT
    assert json.loads(record.read_text())["output_sha256"]
    assert inference._stability(str(state), t, "another answer") is False  # the kept record is compared


def test_the_sdc_goldens_are_not_written_or_read_through_a_planted_link(tmp_path):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / sdc.GOLDEN_FILE).symlink_to(victim)
    store = sdc.GoldenStore(str(state))
    assert store.get("k") == (None, "none")          # the link is not read
    store.put("k", "abc", {"model": "x"}, ["0", "1"], ["0", "1"])
    assert victim.read_text() == VICTIM_TEXT
    assert not (state / sdc.GOLDEN_FILE).is_symlink()
    assert store.get("k") == ("abc", "state")
    assert sorted(p.name for p in state.iterdir()) == [sdc.GOLDEN_FILE]
