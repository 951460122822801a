"""The bandwidth probe (a fake clock, a stub probe, its cache) and the store of measured speeds."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest

from models_registry import bandwidth, datadir
from models_registry.bandwidth import Bandwidth
from models_registry.measured import KEEP, SpeedStore, placement_of

MiB = 1024**2
WHEN = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)

# --------------------------------------------------------------------------------------------- probe


def test_probe_takes_the_best_pass_of_a_fake_clock() -> None:
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])  # passes of 0.5, 0.25 and 0.4 s
    bw = bandwidth.probe_cpu_bandwidth(nbytes=64 * MiB, passes=3, threads=2, clock=lambda: next(ticks))
    assert bw == 64 * MiB / 0.25


def test_bandwidth_is_measured_once_and_cached(tmp_path: Path) -> None:
    path = tmp_path / "bandwidth.json"
    calls: list[int] = []

    def probe() -> float:
        calls.append(1)
        return 30e9 + len(calls)

    first = bandwidth.cpu_bandwidth(path=path, probe=probe, now=lambda: WHEN)
    assert first == Bandwidth(30e9 + 1, "measured", "2026-11-24T12:00:00+00:00") and first.measured
    saved = json.loads(path.read_text())
    assert saved["bytes_per_second"] == 30e9 + 1 and saved["cpu"] == bandwidth.cpu_name()
    again = bandwidth.cpu_bandwidth(path=path, probe=probe)
    assert again == Bandwidth(30e9 + 1, "cached", "2026-11-24T12:00:00+00:00") and len(calls) == 1
    assert bandwidth.cached_cpu_bandwidth(path) == again
    # on request it is measured again
    assert bandwidth.cpu_bandwidth(path=path, probe=probe, remeasure=True).bytes_per_second == 30e9 + 2
    assert len(calls) == 2
    # a figure taken on another CPU is not this one's
    path.write_text(json.dumps({**saved, "cpu": "Some Other CPU"}))
    assert bandwidth.cached_cpu_bandwidth(path) is None
    assert bandwidth.cpu_bandwidth(path=path, probe=probe).source == "measured" and len(calls) == 3


def test_unreadable_bandwidth_cache_is_logged_and_measured_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "bandwidth.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="tandem.registry"):
        bw = bandwidth.cpu_bandwidth(path=path, probe=lambda: 12e9)
    assert bw.source == "measured" and "ignoring unreadable bandwidth cache" in caplog.text
    # a probe that fails leaves the assumed default
    failing = bandwidth.cpu_bandwidth(path=tmp_path / "none.json", probe=lambda: float("nan"))
    assert failing == Bandwidth(bandwidth.DEFAULT_CPU, "assumed") and not failing.measured


def test_the_data_folder_follows_tandem_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    assert bandwidth.bandwidth_file() == tmp_path / "bandwidth.json"
    assert SpeedStore().path == tmp_path / "speeds.json"
    assert datadir.data_dir() == tmp_path


def test_gpu_bandwidth_table() -> None:
    gb = 1e9
    assert bandwidth.gpu_bandwidth("NVIDIA GeForce RTX 4060 Laptop GPU") == 256 * gb
    assert bandwidth.gpu_bandwidth("NVIDIA GeForce RTX 4060 Ti") == 288 * gb
    assert bandwidth.gpu_bandwidth("NVIDIA GeForce RTX 4060") == 272 * gb
    assert bandwidth.gpu_bandwidth("Apple M2 Pro") == 200 * gb
    assert bandwidth.gpu_bandwidth("Apple M2") == 100 * gb
    assert bandwidth.gpu_bandwidth("NVIDIA A100-SXM4-80GB") == 1555 * gb  # "a10" is not "a100"
    assert bandwidth.gpu_bandwidth("Tesla T4") == 320 * gb
    assert bandwidth.gpu_bandwidth("Apple M9 Hyper") == bandwidth.DEFAULT_APPLE
    assert bandwidth.gpu_bandwidth("Mystery GPU") == bandwidth.DEFAULT_GPU
    assert bandwidth.gpu_bandwidth("Intel(R) Graphics", integrated=True, cpu=40 * gb) == 40 * gb


# --------------------------------------------------------------------------------------------- store


def test_record_and_lookup(tmp_path: Path) -> None:
    store = SpeedStore(tmp_path / "speeds.json")
    assert store.lookup("t.gguf", 1000) is None  # no file yet
    for tps in (30.0, 36.0, 31.0):
        store.record("/models/t.gguf", 1000, tps, now=WHEN)
    store.record("t.gguf", 1000, 40.0, mode="speculative", draft=("/m/d.gguf", 100), acceptance=0.7,
                 verify_costs={4: 2.9})  # fmt: skip
    store.record("t.gguf", 1000, 90.0, placement="gpu")
    m = store.lookup("t.gguf", 1000, placement="cpu")
    assert m is not None and (m.file, m.size, m.placement) == ("t.gguf", 1000, "cpu")
    assert m.plain == 31.0  # the median
    assert m.speed("plain") == 31.0 and m.speed("speculative", ("d.gguf", 100)) == 40.0
    assert m.speed("speculative", ("other.gguf", 100)) is None and m.speed("auto", ("d.gguf", 100)) is None
    assert m.acceptance_with(("d.gguf", 100)) == 0.7 and dict(m.verify_costs) == {4: 2.9}
    assert store.lookup("t.gguf", 1000, placement="gpu").plain == 90.0  # type: ignore[union-attr]
    assert store.lookup("T.GGUF", 1000, placement="partial") is None
    # sizes must match, within a tolerance where the catalog's size is rounded
    assert store.lookup("t.gguf", 1010, placement="cpu") is None
    assert store.lookup("t.gguf", 1010, placement="cpu", tolerance=0.02) is not None
    # only the last KEEP figures count
    for _ in range(KEEP):
        store.record("t.gguf", 1000, 10.0)
    assert store.lookup("t.gguf", 1000, placement="cpu").plain == 10.0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="placement"):
        store.record("t.gguf", 1000, 10.0, placement="moon")
    with pytest.raises(ValueError, match="positive"):
        store.record("t.gguf", 1000, 0.0)
    assert (
        placement_of(0, 29) == "cpu" and placement_of(29, 29) == "gpu" and placement_of(10, 29) == "partial"
    )


def test_store_writes_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "speeds.json"
    store = SpeedStore(path)
    store.record("t.gguf", 1000, 30.0)
    before = path.read_text()

    def broken_dump(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(datadir.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        store.record("t.gguf", 1000, 99.0)
    assert path.read_text() == before  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["speeds.json"]  # no temporary file left


def test_corrupt_store_is_ignored_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "speeds.json"
    path.write_text('{"version": 1, "models": [{"file": "t.gguf", "size": 10')
    store = SpeedStore(path)
    with caplog.at_level(logging.WARNING, logger="tandem.registry"):
        assert store.lookup("t.gguf", 10) is None
    assert "ignoring unreadable speed store" in caplog.text and str(path) in caplog.text
    store.record("t.gguf", 10, 5.0)  # the next run starts it again
    assert store.lookup("t.gguf", 10).plain == 5.0  # type: ignore[union-attr]
    # entries of the wrong shape are skipped, not fatal
    path.write_text(json.dumps({"models": [42, {"file": "t.gguf", "size": 10, "runs": [{"mode": 1}]}]}))
    m = store.lookup("t.gguf", 10)
    assert m is not None and m.plain is None
