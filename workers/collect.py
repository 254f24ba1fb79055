"""`python -m workers.collect --job FILE --run-dir DIR --out FILE`: the result document of ranks
that ran elsewhere (a Kubernetes TrainJob's pods), built from their records as a coordinated run's
is (`workers.coordinator.build_document`).

Node 0 runs it after its torchrun exits; on a multi-node job every node's ranks write into the
same run directory (a shared volume), so it waits, up to `--wait-s`, for all of their records.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import BuildContext
from parallab.core.rundir import RunDir
from workers.aggregate import read_rank_records
from workers.coordinator import build_document
from workers.engines.base import EngineFacts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", type=Path, required=True, help="The frozen job (job.json) the ranks ran.")
    parser.add_argument("--run-dir", type=Path, required=True, help="Where the ranks wrote their records.")
    parser.add_argument("--out", type=Path, required=True, help="Where to write the result document (JSON).")
    parser.add_argument("--wait-s", type=float, default=600, help="How long to wait for every rank's record.")
    args = parser.parse_args(argv)
    job = ResolvedJob.model_validate_json(args.job.read_text())
    files = RunDir(args.run_dir)
    deadline = time.monotonic() + args.wait_s
    while True:
        try:
            records = read_rank_records(files, job.world_size)
            break
        except FileNotFoundError as exc:
            if time.monotonic() > deadline:
                print(f"collect: {exc}", file=sys.stderr)
                return 1
            time.sleep(2)
    document = build_document(job, [records], BuildContext(), EngineFacts(), catalogue=None)
    args.out.write_text(document.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
