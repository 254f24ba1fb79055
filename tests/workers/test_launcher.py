"""The launcher's file followers: progress lines arrive whole, log tails stay bounded."""

from __future__ import annotations

import json

from workers.launcher import ProgressTail, read_log_tail


def test_progress_tail_returns_only_complete_new_lines(tmp_path) -> None:
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    assert tail.poll() is None  # no file yet
    path.write_text(json.dumps({"phase": "warmup", "step": 0}) + "\n" + '{"phase": "tr')
    assert tail.poll() == {"phase": "warmup", "step": 0}
    assert tail.poll() is None  # the half-written line is not read
    with path.open("a") as fh:
        fh.write('ain", "step": 0}\n' + json.dumps({"phase": "train", "step": 1}) + "\n")
    assert tail.poll() == {"phase": "train", "step": 1}
    assert tail.latest == {"phase": "train", "step": 1}


def test_log_tail_keeps_the_last_lines(tmp_path) -> None:
    log = tmp_path / "torchrun.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = read_log_tail(log, lines=5)
    assert tail.splitlines() == [f"line {i}" for i in range(995, 1000)]
    assert read_log_tail(tmp_path / "missing.log") == ""
