from __future__ import annotations

import json
import threading
from pathlib import Path

from core.telemetry.events import EventHub
from core.telemetry.run_log import RunLog, new_run_id


def test_records_are_json_lines_with_name_time_level_run_and_rank(tmp_path: Path) -> None:
    hub = EventHub()
    stream = hub.subscribe()
    log = RunLog.create(tmp_path, "exp", "run-1", rank=0, hub=hub)
    log.emit("train_step", loss=0.5, nested={"a": [1, 2]})
    log.error("error", reason="x")
    log.close()
    lines = (tmp_path / "exp" / "run-1" / "events.jsonl").read_text().splitlines()
    first, second = (json.loads(x) for x in lines)
    assert list(first)[:5] == ["event", "ts", "level", "run_id", "rank"]
    assert first["event"] == "train_step" and first["nested"] == {"a": [1, 2]}
    assert second["level"] == "error"
    assert stream._buffer[0] == first  # the hub gets exactly what the file gets


def test_other_ranks_write_their_own_files(tmp_path: Path) -> None:
    log = RunLog.create(tmp_path, "exp", "run-1", rank=3, hub=EventHub())
    log.emit("hello")
    path = log.write_json("config.json", {"a": 1})
    log.close()
    assert (tmp_path / "exp" / "run-1" / "events.rank3.jsonl").exists()
    assert path.name == "config.rank3.json"


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    log = RunLog.create(tmp_path, "exp", "r", rank=0, hub=EventHub())

    def write(tag: str) -> None:
        for i in range(500):
            log.emit("x", tag=tag, i=i, pad="p" * 200)

    threads = [threading.Thread(target=write, args=(t,)) for t in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    lines = log.events_path.read_text().splitlines()
    assert len(lines) == 2000
    assert all(json.loads(line)["event"] == "x" for line in lines)


def test_run_ids_are_unique_and_sortable() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
