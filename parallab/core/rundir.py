"""The files of one run directory — written by the launcher and the ranks, read by the worker.

One place for every name, so the launcher, the ranks, the aggregation and the tests agree:

    job.json              the frozen `ResolvedJob` the ranks run (written by the launcher)
    torchrun.log          torchrun's and every rank's stdout and stderr
    progress.jsonl        live progress, one JSON line per step (one rank writes it)
    rank{r}.json          rank r's `RankRecord`, written atomically at the end
    trace_rank{r}.json.gz rank r's Chrome trace (traced runs, size-capped)
    flight_rank{r}.json   rank r's flight-recorder dump, written when it fails or is stopped (`parallab.core.hangs`)
    failure.json          why the ranks stopped, when a rank knows (`FailureRecord`: the loss diverged)
    noise.json            the host around a Slurm job (`HostNoise`, sampled by its batch script on node 0)
    reference.fetched     a Slurm run whose reference curve its agent copied from the lab database
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def job(self) -> Path:
        return self.path / "job.json"

    @property
    def log(self) -> Path:
        return self.path / "torchrun.log"

    @property
    def progress(self) -> Path:
        return self.path / "progress.jsonl"

    @property
    def failure(self) -> Path:
        """A rank's `FailureRecord` (parallab.core.result), written once by the rank that saw the fault."""
        return self.path / "failure.json"

    @property
    def noise(self) -> Path:
        """The `HostNoise` a Slurm job's batch script sampled around its `srun` (a worker keeps it in memory)."""
        return self.path / "noise.json"

    @property
    def reference_fetched(self) -> Path:
        """Present when the Slurm agent copied the run's reference curve from the lab database into the pool's cache."""
        return self.path / "reference.fetched"

    def rank_record(self, rank: int) -> Path:
        return self.path / f"rank{rank}.json"

    def trace(self, rank: int) -> Path:
        return self.path / f"trace_rank{rank}.json.gz"

    def flight(self, rank: int) -> Path:
        """Rank r's flight-recorder dump (`parallab.core.hangs.Dump`), written when the rank fails or is stopped."""
        return self.path / f"flight_rank{rank}.json"

    def raw_trace(self, rank: int) -> Path:
        """The profiler's uncompressed export, deleted once the rank has read it."""
        return self.path / f".trace_rank{rank}.raw.json"

    def create(self) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def write_atomic(self, target: Path, data: bytes) -> None:
        """Write `data` to `target` so that a reader never sees half of it."""
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
