"""Host noise: what the launcher samples from /proc (a fabricated one here) and when a run is noisy."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from parallab.core.noise import HostNoise, noisy_reasons
from workers.noise import NoiseSampler, cpu_times, launchers, physical_cores

QUIET = {"load_avg_1m_start": 0.2, "load_avg_1m_end": 2.1, "logical_cpus": 8, "physical_cores": 4, "ranks_on_host": 2}


def _proc(root: Path, *, load: float, stat: list[int], cmdlines: dict[int, list[str]]) -> Path:
    root.mkdir(exist_ok=True)
    (root / "loadavg").write_text(f"{load} 0.5 0.2 1/100 999\n")
    (root / "stat").write_text("cpu  " + " ".join(map(str, stat)) + "\ncpu0 1 2 3\n")
    (root / "cpuinfo").write_text(
        "".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\n\n" for i in range(4))  # 4 threads on 2 cores
    )
    for pid, argv in cmdlines.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return root


def test_a_quiet_host_has_no_reasons_and_each_kind_of_noise_is_named() -> None:
    assert noisy_reasons(QUIET) == [] and noisy_reasons(None) == []
    assert noisy_reasons({**QUIET, "ranks_on_host": 6}) == ["6 ranks on 4 physical cores"]
    assert noisy_reasons({**QUIET, "ranks_on_host": 8}) == ["8 ranks on 4 physical cores", "load 0.2 before the start + 8 ranks on 8 CPUs"]
    assert noisy_reasons({**QUIET, "load_avg_1m_start": 7.5}) == ["load 7.5 before the start + 2 ranks on 8 CPUs"]
    assert noisy_reasons({**QUIET, "cpu_steal_fraction": 0.12}) == ["12% of the CPU stolen by the hypervisor"]
    assert noisy_reasons({**QUIET, "cpu_steal_fraction": 0.05}) == []  # at the threshold: not yet
    assert noisy_reasons({**QUIET, "co_running_jobs": 2}) == ["2 other job(s) on the host"]


def test_a_record_out_of_bounds_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="load_avg_1m_start"):
        HostNoise.model_validate({**QUIET, "load_avg_1m_start": -1})
    with pytest.raises(ValidationError, match="cpu_steal_fraction"):
        HostNoise.model_validate({**QUIET, "cpu_steal_fraction": 1.5})
    with pytest.raises(ValidationError, match="surprise"):
        HostNoise.model_validate({**QUIET, "surprise": 1})


def test_the_sampler_reads_load_steal_cores_and_other_launchers(tmp_path: Path) -> None:
    others = {
        101: ["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "workers.harness.main"],
        102: ["/venv/bin/torchrun", "--standalone", "train.py"],
        103: ["/usr/bin/python3", "-m", "workers.harness.main"],  # a rank, not a launcher
        104: ["bash", "-c", "sleep 1; echo torchrun"],  # names it, is not it
    }
    # user nice system idle iowait irq softirq steal
    proc = _proc(tmp_path / "proc", load=1.5, stat=[100, 0, 50, 800, 50, 0, 0, 0], cmdlines=others)
    assert physical_cores(proc) == 2 and launchers(proc) == 2 and launchers(proc, exclude={101}) == 1
    sampler = NoiseSampler(ranks_on_host=4, proc=proc)
    sampler.start()
    # 1000 jiffies later: 600 busy (user + system), 300 idle, 100 stolen
    _proc(proc, load=4.5, stat=[500, 0, 250, 1100, 50, 0, 0, 100], cmdlines={})
    (proc / "102" / "cmdline").write_bytes(b"sleep\0")  # one of the others ended meanwhile
    noise = sampler.stop(exclude={101})
    assert noise is not None
    assert (noise.load_avg_1m_start, noise.load_avg_1m_end) == (1.5, 4.5)
    assert noise.cpu_steal_fraction == pytest.approx(0.1) and noise.cpu_busy_fraction == pytest.approx(0.7)
    assert noise.physical_cores == 2 and noise.ranks_on_host == 4
    assert noise.co_running_jobs == 2, "the larger of before (2) and after (0 besides our own)"
    assert "4 ranks on 2 physical cores" in noisy_reasons(noise)


def test_a_host_without_proc_records_nothing_rather_than_guessing(tmp_path: Path) -> None:
    sampler = NoiseSampler(ranks_on_host=2, proc=tmp_path / "absent")
    sampler.start()
    assert sampler.stop() is None
    assert cpu_times(tmp_path / "absent") is None and physical_cores(tmp_path / "absent") is None
