"""``bench.rollback_costs`` runs end to end on the tests' tiny shapes (the 2B run is for the docs)."""

from __future__ import annotations

import json

from bench import rollback_costs


def test_rollback_costs_measures_every_configuration(tmp_path, capsys) -> None:
    out = tmp_path / "costs.json"
    args = ["--shape", "tiny", "--quant", "Q8_0", "--context", "32", "--repeats", "1", "--threads", "1"]
    assert rollback_costs.main([*args, "--dir", str(tmp_path), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    names = {"hybrid, 16 snapshots", "hybrid, checkpoints only", "attention"}
    assert set(res["ratio"]) == names == set(res["undo_ms"])
    for name in names:
        assert set(res["ratio"][name]) == {str(b) for b in rollback_costs.BATCHES}
        assert res["ratio"][name]["1"][0] == 1.0
    assert set(res["checkpoint"]) == {"hybrid, 16 snapshots", "hybrid, checkpoints only"}
    assert res["checkpoint"]["hybrid, 16 snapshots"]["bytes"] > 0
    assert "| 64 |" in capsys.readouterr().out
