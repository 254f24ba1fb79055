"""Compare's verdict at the repeats a lab runs, by simulation at this machine's measured spread.

    python benchmarks/verdict_power.py [--reps 4000]

Runs' median step times are drawn log-normal at the standard deviation of log(median step time)
measured between 12 runs of one configuration on a shared host (`benchmarks/run_to_run_spread.json`,
`backend.services.glossary.MEASURED_LOG_SPREAD`). For n = 2 … 10 runs a side it prints the t test's
false-positive rate (no difference), its power on a 1.5× difference against the power
`parallab.core.stats.t_power` predicts, the 95 % t interval's coverage of the true ratio, and the
median's order-statistic interval's coverage against the coverage it is labelled with. Mann–Whitney's
smallest attainable two-sided p is beside it: where it exceeds 0.05 that test can never decide.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.services.glossary import MEASURED_LOG_SPREAD  # noqa: E402
from parallab.core.stats import log_ratio_test, median_interval, t_power  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4000)
    reps = parser.parse_args().reps
    rng, s = random.Random(0), MEASURED_LOG_SPREAD

    def runs(n: int, factor: float = 1.0) -> list[float]:
        return [0.1 * factor * math.exp(rng.gauss(0, s)) for _ in range(n)]

    print(f"spread (sd of log step time) {s}, {reps} trials per cell")
    columns = ("n a side", "false positives", "power at 1.5× (predicted)", "t interval covers", "median interval covers (label)")
    print("| " + " | ".join((*columns, "Mann–Whitney min p")) + " |")
    print("|---|---|---|---|---|---|")
    for n in range(2, 11):
        false = sum(log_ratio_test(runs(n), runs(n)).significant for _ in range(reps))
        found = covered = median_hits = 0
        for _ in range(reps):
            base, other = runs(n, 1.5), runs(n)
            t = log_ratio_test(base, other)
            found += t.significant
            covered += t.low <= 1.5 <= t.high
            m = median_interval(other)
            median_hits += m.low <= 0.1 <= m.high
        label = median_interval([1.0] * n).coverage
        min_p = 2 / math.comb(2 * n, n)
        print(
            f"| {n} | {false / reps:.1%} | {found / reps:.0%} ({t_power(math.log(1.5), s, n):.0%}) | {covered / reps:.1%} "
            f"| {median_hits / reps:.1%} ({label:.1%}) | {min_p:.3g} |"
        )


if __name__ == "__main__":
    main()
