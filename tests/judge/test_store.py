"""The node's figure store (fleetcanary.judge.store): kept in the state directory, survives restarts,
bounded in size, never loses the node's driver, and starts from nothing on a reimaged node."""
from __future__ import annotations

import os
import random

import pytest

from fleetcanary.core.record import RunRecord
from fleetcanary.judge import figures as figmod
from fleetcanary.judge import publish
from fleetcanary.judge.exposition import families
from fleetcanary.judge.freshness import hold_for
from fleetcanary.judge.stats import DAY
from fleetcanary.judge.store import FILENAME, RETAIN_DAYS, FigureStore

DRIVER = "570.124.06"
GPUS = 8
# The judged probes at their default intervals (seconds) and the labelled figures of one run.
SCHEDULE = {
    "gpu_bandwidth": (900, [("fleetcanary_gpu_memory_bandwidth_bytes_per_second", {"gpu": str(g), "direction": d}, 3e12)
                            for g in range(GPUS) for d in ("d2d", "h2d", "d2h")]),
    "gpu_compute": (1800, [("fleetcanary_gpu_matmul_flops_per_second", {"gpu": str(g), "dtype": d}, 9e14)
                           for g in range(GPUS) for d in ("bf16", "fp16", "tf32", "fp8")]),
    "gpu_p2p": (3600, [("fleetcanary_gpu_p2p_bandwidth_bytes_per_second", {"src_gpu": str(a), "dst_gpu": str(b)}, 4e11)
                       for a in range(GPUS) for b in range(GPUS) if a != b]),
    "collectives": (1800, [("fleetcanary_collective_bus_bandwidth_bytes_per_second",
                            {"collective": c, "size_bytes": str(s), "ranks": "8", "backend": "nccl"}, 2e11)
                           for c in ("all_reduce", "all_gather") for s in (8, 1 << 10, 1 << 16, 1 << 20, 1 << 24)]),
    "host_memory_bandwidth": (600, [("fleetcanary_host_memory_bandwidth_bytes_per_second", {"op": o}, 5e10)
                                    for o in ("copy", "read", "write")]),
    "storage": (1800, [("fleetcanary_storage_read_bytes_per_second", {"target": "local", "cache": c}, 2e9)
                       for c in ("cold", "warm")] +
                [("fleetcanary_storage_first_byte_seconds", {"target": "local", "cache": c}, 2e-4)
                 for c in ("cold", "warm")]),
    "train_step": (3600, [("fleetcanary_train_step_seconds", {"gpu": str(g), "dtype": "bf16"}, 0.2)
                          for g in range(GPUS)]),
    "gpu_sustained": (86400, [("fleetcanary_gpu_sustained_throughput_ratio", {"gpu": str(g)}, 0.97)
                              for g in range(GPUS)]),
}


def record(probe: str, t: float, rng: random.Random, scale: float = 1.0, driver: str = DRIVER) -> RunRecord:
    _, figures = SCHEDULE[probe]
    samples = [{"metric": m, "labels": labels, "value": v * scale * (1 + rng.gauss(0, 0.01))}
               for m, labels, v in figures]
    return RunRecord(probe=probe, outcome="success", started_at=t - 10, wall_seconds=10, samples=samples,
                     environment={"driver_version": driver, "gpu_model": "NVIDIA H100 80GB HBM3", "cpu_model": "EPYC"})


def node_days(store: FigureStore, days: float, start: float = 1_750_000_000.0, probes=None, seed: int = 1) -> float:
    """Feed a node's default schedule for `days`; returns the end time."""
    rng = random.Random(seed)
    runs = sorted((start + k * interval, p) for p, (interval, _) in SCHEDULE.items() if p in (probes or SCHEDULE)
                  for k in range(int(days * DAY // interval)))
    for t, p in runs:
        store.observe(record(p, t, rng))
    return start + days * DAY


def exposition(store: FigureStore, now: float, pool: str = "a") -> dict[str, list]:
    out = {}
    for fam in families(store, {"pool": pool}, now, lambda _probe: hold_for(900, 300)):
        out[fam.name] = [(s.labels, s.value) for s in fam.samples]
    return out


def test_fifteen_days_at_the_default_schedule_fit_in_a_few_mib_and_reload_to_the_same_statistics(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, RETAIN_DAYS + 2)
    size = os.path.getsize(tmp_path / "judge" / FILENAME)
    assert size < 5 * 2**20, f"{size / 2**20:.1f} MiB for {RETAIN_DAYS} days"
    before = exposition(store, end)
    # every series has a change but the daily burn's (no history)
    assert len(before["fleetcanary_judge_change"]) == len(before["fleetcanary_judge_median"]) - 8
    again = FigureStore(str(tmp_path))
    assert exposition(again, end) == before
    assert again.facts["driver_version"] == DRIVER and again.bad_lines == 0


def test_the_file_keeps_the_retention_window_only(tmp_path):
    store = FigureStore(str(tmp_path), retain_days=2)
    end = node_days(store, 5, probes={"gpu_bandwidth"})
    times = [float(line["t"]) for line in store._lines()]
    assert min(times) > end - 3 * DAY and max(times) > end - DAY


def test_a_torn_line_is_skipped_and_counted_and_the_rest_loads(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, 1, probes={"gpu_bandwidth"})
    with open(tmp_path / "judge" / FILENAME, "a") as f:
        f.write('{"t": 1750000000, "p": "gpu_band')
    again = FigureStore(str(tmp_path))
    assert again.bad_lines == 1
    assert exposition(again, end)["fleetcanary_judge_change"] == exposition(store, end)["fleetcanary_judge_change"]


def test_an_unwritable_state_directory_is_counted_and_the_figures_stay_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = FigureStore(str(blocker))
    end = node_days(store, 0.1, probes={"gpu_bandwidth"})
    assert store.write_errors >= 1
    assert len(exposition(store, end)["fleetcanary_judge_median"]) == 24


def test_a_reimaged_node_starts_from_nothing(tmp_path):
    store = FigureStore(str(tmp_path / "fresh"))
    assert store.snapshot() == [] and store.facts == {}
    assert exposition(store, 0.0)["fleetcanary_judge_median"] == []


def test_statistics_stay_published_for_a_day_after_the_newest_run_then_go(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, 3, probes={"gpu_bandwidth"})
    held = exposition(store, end + 0.9 * DAY)
    assert len(held["fleetcanary_judge_change"]) == 24
    gone = exposition(store, end + 1.1 * DAY)
    assert gone["fleetcanary_judge_change"] == [] and gone["fleetcanary_judge_median"] == []
    assert ({"pool": "a", "figure": "gpu_memory_bandwidth", "state": "stale"}, 24.0) in gone["fleetcanary_judge_series"]


def test_every_statistic_carries_the_peer_labels(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, 3, probes={"gpu_bandwidth", "host_memory_bandwidth"})
    labels, value = next(s for s in exposition(store, end)["fleetcanary_judge_change"]
                         if s[0]["figure"] == "gpu_memory_bandwidth")
    assert labels == {"figure": "gpu_memory_bandwidth", "series": labels["series"], "gpu": labels["gpu"], "pool": "a",
                      "model": "NVIDIA H100 80GB HBM3", "driver_version": DRIVER, "baseline": "current_driver",
                      "baseline_driver": DRIVER}
    assert value == pytest.approx(1.0, abs=0.03)
    host = next(s[0] for s in exposition(store, end)["fleetcanary_judge_median"]
                if s[0]["figure"] == "host_memory_bandwidth")
    assert host["model"] == "EPYC" and host["driver_version"] == ""  # not per GPU driver


def test_a_run_without_gpu_facts_keeps_the_nodes_last_known_driver(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, 0.2, probes={"gpu_bandwidth"})
    rec = record("gpu_bandwidth", end + 900, random.Random(3))
    rec.environment = {"driver_version": "unknown", "gpu_model": "unknown"}
    store.observe(rec)
    assert {st.driver for _, st, _ in store.snapshot()} == {DRIVER}


def test_a_replaced_gpu_starts_its_series_again(tmp_path):
    store = FigureStore(str(tmp_path))
    rng = random.Random(5)
    t = 1_750_000_000.0
    for k in range(3 * 96):
        rec = record("gpu_bandwidth", t + k * 900, rng)
        rec.environment["gpus"] = [{"index": g, "uuid": f"GPU-{g}"} for g in range(GPUS)]
        store.observe(rec)
    rec = record("gpu_bandwidth", t + 3 * 96 * 900, rng)
    rec.environment["gpus"] = [{"index": g, "uuid": "GPU-new" if g == 3 else f"GPU-{g}"} for g in range(GPUS)]
    store.observe(rec)
    runs = {k: st.runs for k, st, _ in store.snapshot()}
    assert {n for (_, _, gpu), n in runs.items() if gpu == "3"} == {1}           # the new GPU: its first run
    assert {n for (_, _, gpu), n in runs.items() if gpu == "2"} == {3 * 96 + 1}  # the others keep theirs
    again = FigureStore(str(tmp_path))                                            # the same after a restart
    assert {k: st.runs for k, st, _ in again.snapshot()} == runs
    size = os.path.getsize(tmp_path / "judge" / FILENAME)
    assert size < 3 * 96 * 1200, size  # UUIDs written when they change, not on every line


def test_a_series_without_a_fresh_run_is_held_and_one_without_five_runs_says_how_many(tmp_path):
    store = FigureStore(str(tmp_path))
    end = node_days(store, 0.04, probes={"gpu_bandwidth"})  # 3 runs (0.04 d at 15 min)
    out = {}
    for fam in families(store, {"pool": "a"}, end + 3 * 3600, lambda _p: 86400.0, lambda _p: 1800.0):
        out[fam.name] = [(s.labels, s.value) for s in fam.samples]
    assert {v for _, v in out["fleetcanary_judge_runs"]} == {3.0} and len(out["fleetcanary_judge_runs"]) == 24
    assert out["fleetcanary_judge_median"] == []
    assert out["fleetcanary_judge_series"] == [({"pool": "a", "figure": "gpu_memory_bandwidth", "state": "held"}, 24.0)]


def test_a_held_series_publishes_no_newest_runs_so_a_held_figure_starts_no_page(tmp_path):
    """Issue 38: a GPU that went busy straight after a run that moved its median kept that median published for a
    day, and the change path, whose confirmation reads the newest runs, paged on it hours later (a 1 MiB all-reduce
    for 14 hours on the 49%-busy H200 fleet). Held, the series keeps its median and change (a page that fired holds
    on them) but not the best of its newest runs, which are no longer new: those move to newest_held, which no rule
    starts on and the fast path's hold reads (a page on them holds while nothing has measured the GPU since)."""
    store = FigureStore(str(tmp_path))
    end = node_days(store, 3, probes={"gpu_bandwidth"})

    def published(now: float) -> dict:
        return {fam.name: len(fam.samples)
                for fam in families(store, {"pool": "a"}, now, lambda _p: 86400.0, lambda _p: 1800.0)}
    fresh, held = published(end + 600), published(end + 3 * 3600)
    # fresh: where the judge publishes them at all (no better than the median, or a change past half its floor:
    # judge/publish.py), so some of the 24 and not all
    shown = sum(publish.show_newest(figmod.BY_KEY[k[0]], st) for k, st, _ in store.snapshot())
    assert 0 < fresh["fleetcanary_judge_newest"] == shown < 24 == held["fleetcanary_judge_median"]
    assert held["fleetcanary_judge_newest"] == fresh["fleetcanary_judge_newest_held"] == 0
    assert held["fleetcanary_judge_newest_held"] == shown
    assert held["fleetcanary_judge_change"] == fresh["fleetcanary_judge_change"] == 24


def test_a_held_series_says_when_it_last_ran_and_no_other_does(tmp_path):
    """Issue 38, sixth pass: the warnings' holds keep a page while nothing has measured its series (a frozen median is
    not a recovered one), so the judge says which series are held: fleetcanary_judge_held_last_run_timestamp_seconds,
    the time of the newest run (a timestamp, not an age: the same value for the whole spell), on every held series,
    on no fresh one, and on no stale one (nothing of those is published)."""
    store = FigureStore(str(tmp_path))
    end = node_days(store, 1, probes={"gpu_bandwidth"})

    def held_at(now: float) -> list[float]:
        fam = {f.name: f for f in families(store, {"pool": "a"}, now, lambda _p: 86400.0, lambda _p: 1800.0)}
        return [s.value for s in fam["fleetcanary_judge_held_last_run_timestamp_seconds"].samples]
    last = {st.last for _, st, _ in store.snapshot()}
    assert len(last) == 1 and end - 1800 < (newest := last.pop()) <= end
    assert held_at(end + 600) == []
    assert held_at(end + 3 * 3600) == held_at(end + 20 * 3600) == [newest] * 24
    assert held_at(newest + 86400 + 1) == []


def test_after_an_upgrade_the_old_drivers_verdict_is_published_held_until_the_new_one_has_a_median(tmp_path):
    """Issue 38: the previous driver's median and change stay published, under its driver_version, while the new
    driver warms up, so a page on a GPU slow before its upgrade holds across it. Held as the series is: a busy GPU's
    runs on the new driver keep it until a day after the newest (fifth pass: a day after the old driver's last run,
    it went 80 minutes before the new driver's median came, and the page fired again)."""
    store = FigureStore(str(tmp_path))
    end = node_days(store, 3, probes={"gpu_bandwidth"})
    rng = random.Random(7)
    for k in range(3):                                               # three runs on the new driver, then busy
        store.observe(record("gpu_bandwidth", end + k * 900, rng, driver="580.1"))
    last = end + 2 * 900

    def drivers(now: float) -> dict[str, set]:
        out = exposition(store, now)
        return {name: {(s[0]["driver_version"], s[0].get("baseline", "")) for s in out[name]}
                for name in ("fleetcanary_judge_median", "fleetcanary_judge_change", "fleetcanary_judge_runs")}
    warming = drivers(last + 3600)
    assert warming["fleetcanary_judge_median"] == {(DRIVER, "")}
    assert warming["fleetcanary_judge_change"] == {(DRIVER, "current_driver")}
    assert warming["fleetcanary_judge_runs"] == {("580.1", "")}
    assert len(exposition(store, last + 3600)["fleetcanary_judge_median"]) == 24
    old_last = end - 900                                             # the old driver's last run
    assert drivers(old_last + DAY + 60)["fleetcanary_judge_median"] == {(DRIVER, "")}  # the new driver's runs keep it
    assert drivers(last + DAY - 60)["fleetcanary_judge_median"] == {(DRIVER, "")}
    assert drivers(last + DAY + 60)["fleetcanary_judge_median"] == set()   # a day after the newest: stale
    for k in range(3, 7):                                            # the new driver's median
        store.observe(record("gpu_bandwidth", end + k * 900, rng, driver="580.1"))
    now = drivers(end + 6 * 900 + 60)
    assert now["fleetcanary_judge_median"] == {("580.1", "")} and now["fleetcanary_judge_runs"] == set()
    assert now["fleetcanary_judge_change"] == {("580.1", "previous_driver")}
    # a series that went a day without a run does not get the old verdict back with the new driver's next run
    stale = FigureStore(str(tmp_path / "stale"))
    end = node_days(stale, 3, probes={"gpu_bandwidth"})
    for k in range(3):
        stale.observe(record("gpu_bandwidth", end + k * 900, rng, driver="580.1"))
    stale.observe(record("gpu_bandwidth", end + 1800 + DAY + 600, rng, driver="580.1"))
    assert exposition(stale, end + 1800 + DAY + 660)["fleetcanary_judge_median"] == []
    # the bound is the probe's own hold: a probe held for two days (a daily one) keeps it across that wait
    held2 = {f.name: len(f.samples) for f in families(stale, {"pool": "a"}, end + 1800 + DAY + 660,
                                                      lambda _probe: 2 * DAY)}
    assert held2["fleetcanary_judge_median"] == 24


def test_a_held_drift_reloads_as_it_was_published(tmp_path):
    """The drift of the newest trailing day that had runs enough (stats.Series._held_drift) is kept by the runs, not
    by when the statistics were read: the store reloads its statistics once, at the end, and a restart must not drop
    a held drift that was being published (issue 38, fourth pass)."""
    store = FigureStore(str(tmp_path))
    end = node_days(store, 3, probes={"gpu_bandwidth"})
    store.observe(record("gpu_bandwidth", end + 23.5 * 3600, random.Random(9)))  # busy for a day: a thin window
    held = {k: st.drift for k, st, _ in store.snapshot()}
    assert all(d is not None for d in held.values()) and len(held) == 24
    assert {k: st.drift for k, st, _ in FigureStore(str(tmp_path)).snapshot()} == held
