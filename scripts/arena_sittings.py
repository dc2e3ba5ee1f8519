"""Pools every run of each router over several arena sittings of the same routing, and
splits the tail into the opening burst and the rest.

    python3 scripts/arena_sittings.py OUT...    # say target/arena-r1 target/arena-r1b

Each OUT is one sitting (`OUT=... scripts/arena`), read from its results.jsonl. A row for
each router of each sitting, then (given more than one) a row for each router over all
of them, pooled: the runs, the lowest / median / highest cached
share, the TTFT p50 / p90 / p99 pooled over every turn of every run (arena.py's rule,
to the hundredth), whether that p99 is a turn of the opening burst, and the highest of the
runs' own p99s. Then the same TTFT twice more:
for the opening burst alone (the turns sent within the run's first second: the first
turns of the conversations the replay starts at once, on empty engines, where no router
has anything to go on but load, and how long each waits is mostly how the engines share
the cores) and for every other turn, where the router decides what a turn prefills and
where it waits.

Pooling is only meaningful over sittings of the same routing and workload shape; the
script does not check that, the commands in BENCHMARKS.md do. A sitting whose engines ran
slower than the others' sets most of the pooled tail.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from arena_engines import pct, quantiles

# The opening burst: turns sent within this long after a run's first.
BURST_SECONDS = 1.0


def row(sitting: str, router: str, runs: list[dict]) -> str:
    """One table row for `router`'s `runs` (see the module's docs)."""
    shares = sorted(100 * r["cached_share"] for r in runs)
    burst, rest = [], []
    for run in runs:
        start = min((t["sent_at"] for t in run["turns"]), default=0.0)
        for turn in run["turns"]:
            opening = turn["sent_at"] - start < BURST_SECONDS
            (burst if opening else rest).append(turn["ttft"])
    every = burst + rest
    p99_in_burst = "yes" if every and pct(every, 99) in burst else "no"
    worst = max((pct([t["ttft"] for t in r["turns"]], 99) for r in runs if r["turns"]),
                default=float("nan"))
    return (f"| {sitting} | {router} | {len(runs)} | {shares[0]:.1f} / "
            f"{statistics.median(shares):.1f} / {shares[-1]:.1f}% | {quantiles(every)} s | "
            f"{p99_in_burst} | {worst:.2f} s | {len(burst)}, {quantiles(burst)} s | "
            f"{len(rest)}, {quantiles(rest)} s |")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pooled: dict[str, list[dict]] = {}
    print("| sitting | router | runs | cached share, lowest / median / highest | "
          "TTFT p50 / p90 / p99, every turn | p99 a burst turn | worst run's p99 | "
          "opening burst: turns, p50 / p90 / p99 | other turns: turns, p50 / p90 / p99 |")
    print("|---|---|---:|---|---|---|---|---|---|")
    for out in map(Path, sys.argv[1:]):
        runs: dict[str, list[dict]] = {}
        for line in (out / "results.jsonl").read_text().splitlines():
            run = json.loads(line)
            runs.setdefault(run["router"], []).append(run)
        for router, its in runs.items():
            print(row(out.name, router, its))
            pooled.setdefault(router, []).extend(its)
    if len(sys.argv) > 2:
        for router, its in pooled.items():
            print(row("all", router, its))


if __name__ == "__main__":
    main()
