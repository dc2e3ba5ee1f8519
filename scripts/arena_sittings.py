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

Last, issue 19's bar for grid-route at its defaults (`grid-defaults`) against each peer
(every router not named `grid-*`: another build or config of grid-route in the same
sitting is a baseline, not a peer), a line a sitting and a tally: cached share at least the peer's in each pairing
(runs paired in the order they ran), pooled TTFT p90 and p99 under every peer's, and a
worst run no worse than each peer's worst (lowest cached share, highest run p99). Under
it, each pairing missed, with both cached shares to the thousandth of a point (a miss
can be narrower than the tables' tenth).

Then where each run's cached share comes from: the points of its prompt tokens cached in
conversations' first turns (a system prompt another conversation brought) and in their
later turns (a conversation's own history), per run in the order they ran.

Last, what sets each router's pooled TTFT p90 in each sitting: the turns at or over it, by
kind. Burst turns; first turns behind a shared system prompt sent after the burst (a first
turn of more than the workload's `system_chars` / 8 tokens, half a system prompt at about
4 characters a token, where a first turn without one is a message of at most
`message_chars`, about 200 tokens); other first turns; later turns. Beside them, how many
first turns behind a shared system prompt were sent after the burst, how many found it
cached (more than half of it), and their TTFT median. Such a first turn either finds its
system prompt at the engine it is sent to or prefills all of it, which on these engines
takes about as long as one of the burst's.

Last, for grid-route's runs (`grid-*` routers, whose request logs name each answer's
affinity outcome: `arena_turns.py`), the first turns behind a shared system prompt after
the burst by outcome, and how many of each found it cached: whether an engine the index
names as holding a system prompt still holds it when the next conversation behind it
comes (`sticky`), which is what a host prompt cache changes.

Last, each router's worst run in each sitting, its two halves apart: the lowest cached
share of its runs, the highest of its runs' p99s (at nearest rank over a run's 86 turns,
its slowest turn) and what kind of turn that slowest one is (as above: `burst`, `system`,
`first` or `later`, with its turn number, prompt and cached tokens). Under it, in how many
sittings grid-route's lowest share is no lower than every peer's lowest, and its highest
run p99 no higher than every peer's.

    python3 scripts/arena_sittings.py --from-page BENCHMARKS.md "12a2663's routing"

adds up, by regime, the bar's rows a page holds, as this script printed them for each
sitting (`| arena-r1x | 6 of 6 | yes | ... |`; regime 1 for a sitting named `arena-r1*`,
regime 2 for `arena-r2*`, the "all" rows left out), without the sittings' directories:
the totals over sittings run on several machines. A heading's title (its start) keeps
only the rows under that heading, up to the next heading of its level or above: one
routing's sittings.

Pooling is only meaningful over sittings of the same routing and workload shape; the
script does not check that, the commands in BENCHMARKS.md do. A sitting whose engines ran
slower than the others' sets most of the pooled tail.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from arena_engines import BURST_SECONDS, pct, quantiles
from arena_turns import turns

# The router the bar is for: grid-route with a config naming only the grid.
OURS = "grid-defaults"


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


def bar(sittings: list[tuple[str, dict[str, list[dict]]]]) -> None:
    """Prints the bar's table for OURS against every other router, and its tally."""
    print()
    print("| sitting | cached share ≥ peer's, pairings | pooled p90 under every peer's | "
          "pooled p99 under every peer's | worst run no worse | whole bar |")
    print("|---|---|---|---|---|---|")
    tally = {"pairs": 0, "kept": 0, "p90": 0, "p99": 0, "worst": 0, "whole": 0}
    missed: list[tuple[str, int, float, str, float]] = []
    for name, runs in sittings:
        ours = runs.get(OURS)
        if not ours:
            continue
        peers = {router: its for router, its in runs.items() if not router.startswith("grid-")}
        kept = pairs = 0
        for peer, its in peers.items():
            for a, b in zip(ours, its):
                pairs += 1
                kept += a["cached_share"] >= b["cached_share"]
                if a["cached_share"] < b["cached_share"]:
                    missed.append((name, a["repeat"], a["cached_share"], peer, b["cached_share"]))
        every = {r: [t["ttft"] for run in its for t in run["turns"]] for r, its in runs.items()}
        under = {q: all(pct(every[OURS], q) < pct(every[r], q) for r in peers) for q in (90, 99)}

        def worst(its: list[dict]) -> tuple[float, float]:
            return (min(r["cached_share"] for r in its),
                    max(pct([t["ttft"] for t in r["turns"]], 99) for r in its))

        w = worst(ours)
        no_worse = all(w[0] >= worst(its)[0] and w[1] <= worst(its)[1] for its in peers.values())
        whole = kept == pairs and under[90] and under[99] and no_worse
        yes = {True: "yes", False: "no"}
        print(f"| {name} | {kept} of {pairs} | {yes[under[90]]} | {yes[under[99]]} | "
              f"{yes[no_worse]} | {yes[whole]} |")
        for key, value in (("pairs", pairs), ("kept", kept), ("p90", under[90]),
                           ("p99", under[99]), ("worst", no_worse), ("whole", whole)):
            tally[key] += value
    n = sum(1 for _, runs in sittings if runs.get(OURS))
    print(f"| all | {tally['kept']} of {tally['pairs']} | {tally['p90']} of {n} | "
          f"{tally['p99']} of {n} | {tally['worst']} of {n} | {tally['whole']} of {n} |")
    if missed:
        print()
        print(f"| sitting | run | {OURS} cached share | peer | peer's cached share |")
        print("|---|---:|---:|---|---:|")
        for name, repeat, ours_share, peer, peer_share in missed:
            print(f"| {name} | {repeat} | {100 * ours_share:.3f}% | {peer} | {100 * peer_share:.3f}% |")


def split(sittings: list[tuple[str, dict[str, list[dict]]]]) -> None:
    """Prints each run's cached share as first turns + later turns (see the module's docs)."""
    print()
    print("| sitting | router | cached share a run: first turns + later turns, points |")
    print("|---|---|---|")
    for name, runs in sittings:
        for router, its in runs.items():
            cells = []
            for run in its:
                prompt = sum(t["prompt_tokens"] for t in run["turns"]) or 1
                first = sum(t["cached_tokens"] for t in run["turns"] if t["turn"] == 0)
                later = sum(t["cached_tokens"] for t in run["turns"] if t["turn"] > 0)
                cells.append(f"{100 * first / prompt:.1f} + {100 * later / prompt:.1f}")
            print(f"| {name} | {router} | {'; '.join(cells)} |")


def kinds_of(run: dict, turns: list[dict]) -> list[tuple[str, dict]]:
    """Each of `run`'s `turns` with its kind: `burst`, `later`, `system` (a first turn
    behind a shared system prompt, after the burst) or `first` (see the module's docs)."""
    start = min((t["sent_at"] for t in turns), default=0.0)

    def kind(t: dict) -> str:
        if t["sent_at"] - start < BURST_SECONDS:
            return "burst"
        if t["turn"] > 0:
            return "later"
        return "system" if t["prompt_tokens"] > run["system_tokens"] else "first"

    return [(kind(t), t) for t in turns]


def tail(sittings: list[tuple[str, dict[str, list[dict]]]]) -> None:
    """Prints what sets each router's pooled TTFT p90 (see the module's docs)."""
    print()
    print("| sitting | router | pooled p90 | turns at or over it: burst / first behind a "
          "system prompt / other first / later | first turns behind a system prompt after "
          "the burst: turns, found it cached, TTFT p50 |")
    print("|---|---|---:|---|---|")
    for name, runs in sittings:
        for router, its in runs.items():
            kinds = [(kind, t) for run in its for kind, t in kinds_of(run, run["turns"])]
            p90 = pct([t["ttft"] for _, t in kinds], 90)
            over = [kind for kind, t in kinds if t["ttft"] >= p90]
            counts = " / ".join(str(over.count(k)) for k in ("burst", "system", "first", "later"))
            system = [t for kind, t in kinds if kind == "system"]
            found = sum(t["cached_tokens"] > t["prompt_tokens"] / 2 for t in system)
            median = statistics.median(t["ttft"] for t in system) if system else float("nan")
            print(f"| {name} | {router} | {p90:.2f} s | {len(over)}: {counts} | "
                  f"{len(system)}, {found}, {median:.2f} s |")


def held(sittings: list[tuple[str, dict[str, list[dict]]]]) -> None:
    """Prints grid-route's first turns behind a shared system prompt by outcome (see the
    module's docs)."""
    print()
    print("| sitting | router | first turns behind a system prompt after the burst, by "
          "affinity outcome: found it cached / turns |")
    print("|---|---|---|")
    for name, runs in sittings:
        for router, its in runs.items():
            if not router.startswith("grid-"):
                continue
            found: dict[str, list[int]] = {}
            for run in its:
                rows = turns(run["out"], f"{router}-{run['repeat']}")
                for kind, t in kinds_of(run, rows):
                    if kind == "system":
                        tally = found.setdefault(t["outcome"], [0, 0])
                        tally[0] += t["cached_tokens"] > t["prompt_tokens"] / 2
                        tally[1] += 1
            cells = ", ".join(f"{o} {f} / {n}" for o, (f, n) in sorted(found.items()))
            print(f"| {name} | {router} | {cells} |")


def worst_runs(sittings: list[tuple[str, dict[str, list[dict]]]]) -> None:
    """Prints each router's worst run, its two halves apart, and grid-route's tally of
    each half against the peers (see the module's docs)."""
    print()
    print("| sitting | router | lowest cached share | highest run p99 | its slowest turn |")
    print("|---|---|---:|---:|---|")
    tally = {"share": 0, "p99": 0, "sittings": 0}
    for name, runs in sittings:
        worst: dict[str, tuple[float, float]] = {}
        for router, its in runs.items():
            lowest = min(r["cached_share"] for r in its)
            slowest = max(its, key=lambda r: pct([t["ttft"] for t in r["turns"]], 99))
            kind, turn = max(kinds_of(slowest, slowest["turns"]), key=lambda kt: kt[1]["ttft"])
            p99 = pct([t["ttft"] for t in slowest["turns"]], 99)
            worst[router] = (lowest, p99)
            print(f"| {name} | {router} | {100 * lowest:.3f}% | {p99:.2f} s | {kind}, "
                  f"turn {turn['turn'] + 1}, {turn['cached_tokens']}/{turn['prompt_tokens']} "
                  f"tokens cached, run {slowest['repeat']} |")
        if OURS not in worst:
            continue
        peers = [w for router, w in worst.items() if not router.startswith("grid-")]
        tally["sittings"] += 1
        tally["share"] += all(worst[OURS][0] >= w[0] for w in peers)
        tally["p99"] += all(worst[OURS][1] <= w[1] for w in peers)
    n = tally["sittings"]
    print()
    print(f"{OURS}'s lowest cached share no lower than every peer's lowest: {tally['share']} "
          f"of {n} sittings; its highest run p99 no higher than every peer's: {tally['p99']} "
          f"of {n}.")


# One sitting's row of `bar`'s table: the sitting (its regime the digit after `arena-r`),
# pairings kept of pairings, then p90, p99, worst run and whole bar.
BAR_ROW = re.compile(r"^\| (arena-r([12])\w*) \| (\d+) of (\d+) \| (yes|no) \| (yes|no) "
                     r"\| (yes|no) \| (yes|no) \|$")


def from_page(page: Path, section: str | None = None) -> None:
    """Prints the bar's rows `page` holds added up by regime, each sitting counted once;
    with `section`, only those under the heading whose title starts with it."""
    seen: dict[str, tuple[str, ...]] = {}
    level = None  # the section's heading level while inside it
    inside = section is None
    for line in page.read_text().splitlines():
        if heading := re.match(r"^(#+) (.*)$", line):
            depth, title = len(heading[1]), heading[2]
            if section is not None and title.startswith(section):
                level, inside = depth, True
            elif level is not None and depth <= level:
                level, inside = None, False
            continue
        if inside and (m := BAR_ROW.match(line)):
            seen.setdefault(m[1], m.groups()[1:])
    if not seen:
        sys.exit(f"no sitting's row in {page}" + (f" under a heading {section!r}" if section else ""))
    print("| regime | sittings | cached share ≥ peer's, pairings | pooled p90 under every peer's | "
          "pooled p99 under every peer's | worst run no worse | whole bar |")
    print("|---|---:|---|---|---|---|---|")
    flags = {"1": "--cache-ram 0", "2": "--cache-ram 8192"}
    for regime in ("1", "2", None):
        rows = [(name, g) for name, g in seen.items() if regime in (None, g[0])]
        if not rows:
            continue
        n = len(rows)
        kept = sum(int(g[1]) for _, g in rows)
        pairs = sum(int(g[2]) for _, g in rows)
        yes = [sum(g[i] == "yes" for _, g in rows) for i in range(3, 7)]
        label = (f"{regime} (`{flags[regime]}`): "
                 + ", ".join(name.removeprefix("arena-") for name, _ in rows)
                 if regime else "both")
        print(f"| {label} | {n} | {kept} of {pairs} | " + " | ".join(f"{y} of {n}" for y in yes) + " |")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--from-page":
        if len(sys.argv) not in (3, 4):
            sys.exit(__doc__)
        from_page(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 else None)
        return
    pooled: dict[str, list[dict]] = {}
    sittings: list[tuple[str, dict[str, list[dict]]]] = []
    print("| sitting | router | runs | cached share, lowest / median / highest | "
          "TTFT p50 / p90 / p99, every turn | p99 a burst turn | worst run's p99 | "
          "opening burst: turns, p50 / p90 / p99 | other turns: turns, p50 / p90 / p99 |")
    print("|---|---|---:|---|---|---|---|---|---|")
    for out in map(Path, sys.argv[1:]):
        runs: dict[str, list[dict]] = {}
        workload = json.loads((out / "workload.json").read_text())
        for line in (out / "results.jsonl").read_text().splitlines():
            run = json.loads(line)
            # What `kinds_of` and `held` need of the sitting: see the module's docs.
            run["system_tokens"] = workload["system_chars"] / 8
            run["out"] = out
            runs.setdefault(run["router"], []).append(run)
        for router, its in runs.items():
            print(row(out.name, router, its))
            pooled.setdefault(router, []).extend(its)
        sittings.append((out.name, runs))
    if len(sys.argv) > 2:
        for router, its in pooled.items():
            print(row("all", router, its))
    bar(sittings)
    split(sittings)
    tail(sittings)
    held(sittings)
    worst_runs(sittings)


if __name__ == "__main__":
    main()
