"""benchmarks/quantize_speed.py's GPU sets: compared with the project's defaults, not with options it left."""

from __future__ import annotations

import json

from benchmarks import quantize_speed as qs


def cpu_summary() -> dict:
    return json.loads(qs.OUT.read_text())["summary"]


def test_the_gpu_sets_start_from_the_cpu_choice_then_each_gpu_option_then_all():
    awq = qs.gpu_sets(cpu_summary())["awq"]
    chosen = cpu_summary()["awq"]["fastest_within_tolerance"]
    names = [name for name, _ in awq]
    assert names == [
        chosen,
        f"{chosen}+sequential_targets_per_subgraph=4",
        f"{chosen}+batch_size=4",
        f"{chosen}+sequential_targets_per_subgraph=4+batch_size=4",
    ]
    assert awq[-1][1] == {**awq[0][1], **awq[1][1], **awq[2][1]}
    # GPTQ: the CPU chose nothing, so its baseline is today's and it has one GPU option
    assert [name for name, _ in qs.gpu_sets(cpu_summary())["gptq"]] == [
        "today",
        "today+sequential_targets_per_subgraph=4",
    ]


def test_picking_sets_keeps_each_methods_baseline():
    sets = qs.gpu_sets(cpu_summary())
    assert qs.pick(sets, "awq:*") == {"awq": sets["awq"]}
    one = qs.pick(sets, f"awq:{sets['awq'][2][0]}")
    assert one == {"awq": [sets["awq"][0], sets["awq"][2]]}


def test_the_gpu_summary_compares_with_the_baseline():
    sets = {"awq": [("base", {}), ("base+b4", {"calibration.batch_size": 4})]}

    def run(name: str, repeat: int, calibrate: float) -> dict:
        stages = {"prepare": 10.0, "calibrate": calibrate}
        return {
            "method": "awq",
            "set": name,
            "repeat": repeat,
            "seconds": calibrate + 10,
            "stage_seconds": stages,
            "stage_cpu_seconds": stages,
            "calibration_passes": {},
            "load_average_1min": 1.0,
        }

    runs = [run("base", 0, 148.7), run("base+b4", 0, 114.6), run("base+b4", 1, 113.3), run("base", 1, 144.7)]
    summary = qs.summarize(runs, sets, with_recovery=False, measure="stage_seconds")["awq"]
    base, b4 = summary["rows"]
    assert not base["saves_time"] and base["calibrate_saved_s"] == 0
    assert b4["saves_time"] and b4["calibrate_saved_s"] == round(146.7 - 113.95, 2)
    assert summary["fastest_within_tolerance"] == "base+b4"
