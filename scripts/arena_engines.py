"""Reads which engine and slot served each turn of an arena run, from the engines' own logs,
and counts the turns that moved to another engine than their conversation's turn before
and the turns that lost their conversation's prompt.

    python3 scripts/arena_engines.py OUT RUN...     # say target/arena-r1 grid-defaults-1

llama-server logs each task's slot (`launch_slot_: id S | task T`), the tokens it
evaluated (`prompt eval time = ... / N tokens`) and its length when it stopped
(`stop processing: n_tokens = M`: the prompt, then the answer). A turn of the run's
results.jsonl is matched to the one task whose evaluated tokens are its prompt tokens less
its cached ones and whose stopping length is its prompt plus an answer of at most 34
tokens (the arena asks for 32); a turn no task matches is shown as `?` and never counted as
a move. A turn *lost its prompt* when it found less than 80% of its conversation's previous
prompt cached. A first turn that found more than 100 tokens cached found a shared system
prompt (a chat template's opening is under 30), and those are counted too. Any router's run
can be read: only the engines' logs are used.

Each run's opening burst follows its turns: the first turns sent in its first second (six
at once, one a client), engine by engine in the order they were sent, with their prompt
tokens and TTFT, and how many engines were given two long ones (over 500 tokens). A
llama.cpp engine prefills a prompt in one pass, and a request that arrives during the pass
starts when it ends: the second of two long first turns on one engine waits for both
prefills. Four long first turns on three engines put two on one engine whatever the router
does; a router that pairs each short one with a long one puts them on one engine only.
Two prompts an engine launched within 0.1 s of each other (its log's timestamps) were
prefilled in one pass, and each waited for both: the burst line marks them `one pass`, and
counts the engines whose two long first turns shared one.

    python3 scripts/arena_engines.py --pairs OUT...   # every run of each sitting OUT

prints, instead, every engine given exactly two long first turns in a burst, over every run
of the sittings given (any router): how many were prefilled in one pass and how many in two,
and the mean time to first token of the slower and the faster of each two; then, per router,
how many of its runs gave two long first turns to no engine, one, two or three (one is the
fewest four long first turns on three engines allow); then, per router, how many runs'
slowest turn was the slower of two long first turns on one engine, and that turn's TTFT over
those runs (lowest / median, the lower middle one of an even count / highest), with the two
turns' prompt tokens together (the slower waits for both prefills). A run's p99
by arena.py's rule is its slowest turn (rank 80 of 80), and the p99 of three runs pooled
their third slowest: where each run's slowest is that turn and every other turn is faster
than all three, the pooled p99 is the lowest of the three and the worst run's p99 the
highest: both are drawn from that one turn's spread.

Last, for each router among RUN..., the TTFT p50 / p90 / p99 pooled over the runs given,
to the hundredth of a second, by the rule of arena.py's table (which prints tenths); then
the same for first turns and for later turns apart.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

HEAD_TOKENS = 100
# The opening burst: turns sent within this long after a run's first.
BURST_SECONDS = 1.0
LONG_FIRST_TURN = 500
LAUNCH = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*launch_slot_: id +(\d+) \| task (\d+)")
# Two prompts launched this close together went into the engine's same prefill pass: one
# launched after a pass ended waited at least that pass (the shortest, 65 tokens, ~0.6 s).
ONE_PASS_SECONDS = 0.1
EVALUATED = re.compile(r"task (\d+) \| prompt eval time = .*/ +(\d+) tokens")
STOPPED = re.compile(r"release: id +\d+ \| task (\d+) \| stop processing: n_tokens = (\d+)")
MAX_ANSWER_TOKENS = 34


def tasks(run_dir: Path) -> list[dict]:
    """Every finished task of every engine of the run: engine, slot, evaluated, stopped."""
    found = []
    for log in sorted(run_dir.glob("engine*.log")):
        engine = log.stem.removeprefix("engine")
        open_tasks: dict[str, dict] = {}
        for line in log.read_text(errors="replace").splitlines():
            if m := LAUNCH.search(line):
                # The log's clock: minutes.seconds.milliseconds.microseconds since start.
                launched = int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
                open_tasks[m[6]] = {"engine": engine, "slot": m[5], "launched": launched}
            elif (m := EVALUATED.search(line)) and m[1] in open_tasks:
                open_tasks[m[1]]["evaluated"] = int(m[2])
            elif (m := STOPPED.search(line)) and m[1] in open_tasks:
                task = open_tasks.pop(m[1])
                task["stopped"] = int(m[2])
                found.append(task)
    return found


def pct(values: list[float], p: float) -> float:
    """arena.py's percentile: the value at rank ceil(p% of n)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def quantiles(ttfts: list[float]) -> str:
    """TTFT p50 / p90 / p99 to the hundredth, by `pct`."""
    return " / ".join(f"{pct(ttfts, p):.2f}" for p in (50, 90, 99)) if ttfts else "-"


def result_of(out: Path, run: str) -> dict:
    router, repeat = run.rsplit("-", 1)
    return next(r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
                if r["router"] == router and r["repeat"] == int(repeat))


def matched(out: Path, run: str) -> list[dict]:
    """The run's turns in the order sent, each with the engine/slot of its task (`?` when
    none matched) and when the engine launched it (`None` then)."""
    left = tasks(out / run)
    turns = sorted(result_of(out, run)["turns"], key=lambda t: t["sent_at"])
    for turn in turns:
        evaluated = turn["prompt_tokens"] - turn["cached_tokens"]
        match = next((t for t in left if t.get("evaluated") == evaluated
                      and 0 < t["stopped"] - turn["prompt_tokens"] <= MAX_ANSWER_TOKENS), None)
        if match:
            left.remove(match)
        turn["engine"] = f"{match['engine']}/{match['slot']}" if match else "?"
        turn["launched"] = match["launched"] if match else None
    return turns


def read(out: Path, run: str) -> None:
    turns = matched(out, run)
    previous: dict[str, dict] = {}
    moved, lost, lost_tokens = [], 0, 0
    start = turns[0]["sent_at"] if turns else 0.0
    for turn in turns:
        before = previous.get(turn["conversation"])
        note = ""
        if before:
            engines = (before["engine"].split("/")[0], turn["engine"].split("/")[0])
            if "?" not in engines and engines[0] != engines[1]:
                moved.append(turn)
                note += f" moved from {engines[0]}"
            if turn["cached_tokens"] < 0.8 * before["prompt_tokens"]:
                lost += 1
                lost_tokens += before["prompt_tokens"] - turn["cached_tokens"]
                note += " lost its prompt"
        print(f"{turn['sent_at'] - start:7.1f} s  {turn['conversation']:<12} turn {turn['turn'] + 1}"
              f"  engine/slot {turn['engine']:<4} cached {turn['cached_tokens']:>5} of "
              f"{turn['prompt_tokens']:>5}{note}")
        previous[turn["conversation"]] = turn
    total = sum(t["prompt_tokens"] for t in turns)
    # A first turn can find only what other conversations share cached: the chat
    # template's opening (under 30 tokens) or a shared system prompt.
    heads = sum(1 for t in turns if t["turn"] == 0 and t["cached_tokens"] > HEAD_TOKENS)
    print(f"{run}: {len(moved)} turns moved to another engine; {lost} lost their prompt "
          f"({lost_tokens} tokens, {100 * lost_tokens / total:.1f} points of the cached share); "
          f"{heads} first turns found a shared system prompt cached")
    burst(run, turns)


def burst_by_engine(turns: list[dict]) -> dict[str, list[dict]]:
    """The opening burst's first turns (`turns` in the order sent), by engine."""
    start = turns[0]["sent_at"] if turns else 0.0
    by_engine: dict[str, list[dict]] = {}
    for turn in turns:
        if turn["turn"] == 0 and turn["sent_at"] - start < BURST_SECONDS:
            by_engine.setdefault(turn["engine"].split("/")[0], []).append(turn)
    return by_engine


def long_by_engine(by_engine: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The long first turns (over [`LONG_FIRST_TURN`] tokens) of each engine read (not `?`)
    in `by_engine`."""
    return {engine: [t for t in sent if t["prompt_tokens"] > LONG_FIRST_TURN]
            for engine, sent in by_engine.items() if engine != "?"}


def one_pass(sent: list[dict]) -> bool:
    """Whether the engine launched two of `sent` within [`ONE_PASS_SECONDS`]: one pass."""
    launched = sorted(t["launched"] for t in sent if t["launched"] is not None)
    return any(b - a < ONE_PASS_SECONDS for a, b in zip(launched, launched[1:]))


def pairs(outs: list[Path]) -> None:
    """Every engine given two long first turns in an opening burst, over every run of every
    sitting in `outs`, any router: in one pass or two, how many, and the mean time to first
    token of the slower and the faster of the two."""
    found: dict[str, list[tuple[float, float]]] = {"one pass": [], "two passes": []}
    # Per router, how many runs gave two long first turns to how many engines.
    doubled: dict[str, dict[int, int]] = {}
    # Per router, each run's slowest TTFT when it was the slower of two long first turns on
    # one engine (the router's other runs are the rest of `doubled`'s count), and the two
    # turns' prompt tokens together.
    slowest_doubled: dict[str, list[float]] = {}
    doubled_tokens: dict[str, list[int]] = {}
    for out in outs:
        for run_dir in sorted(p for p in out.iterdir() if (p / "engine0.log").exists()):
            turns = matched(out, run_dir.name)
            doubles = [long for long in long_by_engine(burst_by_engine(turns)).values()
                       if len(long) >= 2]
            router = run_dir.name.rsplit("-", 1)[0]
            runs = doubled.setdefault(router, {})
            runs[len(doubles)] = runs.get(len(doubles), 0) + 1
            slowest = max(turns, key=lambda t: t["ttft"]) if turns else None
            for long in doubles:
                if max(long, key=lambda t: t["ttft"]) is slowest:
                    slowest_doubled.setdefault(router, []).append(slowest["ttft"])
                    doubled_tokens.setdefault(router, []).append(
                        sum(t["prompt_tokens"] for t in long))
            for long in doubles:
                if len(long) != 2 or None in (t["launched"] for t in long):
                    continue
                ttfts = sorted(t["ttft"] for t in long)
                found["one pass" if one_pass(long) else "two passes"].append((ttfts[1], ttfts[0]))
    print("| two long first turns on one engine | engines | slower TTFT, mean | faster TTFT, mean |")
    print("|---|---:|---:|---:|")
    for kind, seen in found.items():
        if seen:
            slower = sum(s for s, _ in seen) / len(seen)
            faster = sum(f for _, f in seen) / len(seen)
            print(f"| {kind} | {len(seen)} | {slower:.2f} s | {faster:.2f} s |")
    print()
    print("| router | runs | engines given two long first turns: runs with 0 / 1 / 2 / 3 |")
    print("|---|---:|---|")
    for router, runs in sorted(doubled.items()):
        counts = " / ".join(str(runs.get(n, 0)) for n in range(4))
        print(f"| {router} | {sum(runs.values())} | {counts} |")
    print()
    print("| router | runs | slowest turn the slower of two long first turns on one engine "
          "| its TTFT: lowest / median / highest | the two's prompt tokens: lowest / median / highest |")
    print("|---|---:|---:|---|---|")

    def spread(values: list, unit: str, digits: int) -> str:
        seen = sorted(values)
        if not seen:
            return "-"
        return " / ".join(f"{v:.{digits}f}" for v in (seen[0], seen[(len(seen) - 1) // 2], seen[-1])) + unit

    for router, runs in sorted(doubled.items()):
        seen = slowest_doubled.get(router, [])
        print(f"| {router} | {sum(runs.values())} | {len(seen)} | {spread(seen, ' s', 2)} "
              f"| {spread(doubled_tokens.get(router, []), '', 0)} |")


def burst(run: str, turns: list[dict]) -> None:
    """The run's opening burst (see the module's doc), `turns` in the order sent, each with
    its engine read."""
    if not turns:
        return
    by_engine = burst_by_engine(turns)
    parts = []
    for engine, sent in sorted(by_engine.items()):
        tokens = " then ".join(str(t["prompt_tokens"]) for t in sent)
        ttfts = " / ".join(f"{t['ttft']:.1f}" for t in sent)
        parts.append(f"engine {engine}: {tokens} tokens, TTFT {ttfts} s"
                     f"{', one pass' if engine != '?' and one_pass(sent) else ''}")
    long = long_by_engine(by_engine)
    long_pairs = sum(1 for sent in long.values() if len(sent) >= 2)
    shared = sum(1 for sent in long.values() if len(sent) >= 2 and one_pass(sent))
    slowest = max(t["ttft"] for sent in by_engine.values() for t in sent)
    print(f"{run}: opening burst: {'; '.join(parts)}; engines given two long first turns: "
          f"{long_pairs}, of them in one pass: {shared}; slowest {slowest:.1f} s")


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--pairs":
        pairs([Path(out) for out in sys.argv[2:]])
        return
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    pooled: dict[str, list[dict]] = {}
    for run in sys.argv[2:]:
        read(out, run)
        pooled.setdefault(run.rsplit("-", 1)[0], []).extend(result_of(out, run)["turns"])

    def ttfts(turns: list[dict]) -> str:
        return quantiles([t["ttft"] for t in turns])

    for router, turns in pooled.items():
        print(f"{router}: TTFT p50 / p90 / p99 pooled over the runs given {ttfts(turns)} s")
    # A first turn's prefill is its whole prompt, wherever it goes: on these engines it
    # is most of the tail. A later turn's is what its engine lost of the conversation.
    for router, turns in pooled.items():
        first = [t for t in turns if t["turn"] == 0]
        later = [t for t in turns if t["turn"] > 0]
        print(f"{router}: first turns ({len(first)}) {ttfts(first)} s; "
              f"later turns ({len(later)}) {ttfts(later)} s")


if __name__ == "__main__":
    main()
