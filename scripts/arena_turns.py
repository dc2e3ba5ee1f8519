"""Reads one grid-route run of the arena turn by turn: which engine answered each turn, with
what affinity outcome, and how much of its prompt was cached; how many new conversations
started on an engine that already had more live conversations than another; and where the
cached share went.

Where it went: a turn after the first can at best find its conversation's previous prompt
cached, so the run's ceiling from history is the sum of those over all prompt tokens. Each
turn's shortfall against it is counted by its outcome, whether the conversation stayed on
its engine or moved, and the load it met: the other turns in flight at that engine when it
was sent (a turn ends when its conversation's next one is sent; a conversation's last turn
one second after its first token, which is not logged); then how much of that shortfall
is in turns that lost their slot (below). First turns add what they found
cached (a shared system prompt). Then each later turn that stayed on its engine and found
under half of the prompt of its turn before (its slot was taken), with the new
conversations' first turns sent to that engine from its turn before until a second after
it (the likely takers, with their send time against its own). Then the opening burst
as it reached the gateway, engine by engine, with the milliseconds between first turns
that went to one engine. Then when the gateway's verdict on whether a cluster's engines
keep shared heads changed (engine feedback logs each change at info; the verdict starts
at "not kept", and only a first turn stuck to a holder of its head no busier than the
others asks), in seconds after the run's first request reached it: where heads are kept a
new conversation may join a busier holder of its head, and until then it is placed
elsewhere. Last, the run's five slowest turns by time to first token.

    python3 scripts/arena_turns.py OUT RUN        # say target/arena-s21 grid-defaults-pck-1

The arena's results.jsonl gives each turn's send time and tokens; the gateway's request log
(OUT/RUN/gateway.log) gives each answer's request id, outcome and site. A turn is matched to
the log line of its request id (the arena sends `CONVERSATION-TURN`). A run recorded before
the arena sent ids, or before the log printed them, is matched by time instead: to the line
whose head time minus latency is nearest the turn's send time, which can swap two turns
sent in the same few milliseconds (the opening burst).
"""

from __future__ import annotations

import collections
import datetime
import json
import re
import sys
from pathlib import Path

from arena import request_id
from arena_engines import BURST_SECONDS

ACCESS = re.compile(r'(\S+)Z .*grid_route_example::access.*outcome="(\w+)" site="(\w+)".*latency_ms=([\d.]+)')
REQUEST_ID = re.compile(r'request_id="([^"]*)"')
VERDICT = re.compile(r'(\S+)Z .*engine feedback: a first turn (found|missed) its shared head'
                     r'.*cluster=(\S+) .*keeps_shared_heads=(true|false)')


def log_time(stamp: str) -> float:
    """A gateway log line's UTC time (its first field, without the `Z`), in epoch seconds."""
    return datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp()


def turns(out: Path, run: str) -> list[dict]:
    router, repeat = run.rsplit("-", 1)
    result = next(r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
                  if r["router"] == router and r["repeat"] == int(repeat))
    sent = []
    for line in (out / run / "gateway.log").read_text().splitlines():
        m = ACCESS.match(line)
        if m:
            head = log_time(m[1])
            id_ = REQUEST_ID.search(line)
            sent.append((head - float(m[4]) / 1000, m[2], m[3], id_[1] if id_ else None))
    by_id = {s[3]: i for i, s in enumerate(sent) if s[3] is not None}
    used: set[int] = set()
    rows = []
    for t in sorted(result["turns"], key=lambda t: t["sent_at"]):
        i = by_id.get(request_id(t["conversation"], t["turn"]))
        if i is None:
            _, i = min((abs(s[0] - t["sent_at"]), i) for i, s in enumerate(sent) if i not in used)
        used.add(i)
        rows.append({**t, "outcome": sent[i][1], "site": sent[i][2], "arrived": sent[i][0]})
    return rows


def verdicts(out: Path, run: str, rows: list[dict]) -> str:
    """Each change of the heads verdict the run's gateway logged: seconds after the first
    request reached it, cluster, kept or not."""
    start = min(r["arrived"] for r in rows)
    changes = []
    for line in (out / run / "gateway.log").read_text().splitlines():
        if m := VERDICT.match(line):
            at = log_time(m[1])
            kept = "kept" if m[4] == "true" else "not kept"
            changes.append(f"{at - start:.1f} s {m[3]} {kept} (a first turn {m[2]} its head)")
    return "; ".join(changes) or "none: not kept the whole run"


def lost_its_slot(before: dict, turn: dict) -> bool:
    """Whether `turn` stayed on the engine of the turn `before` it yet found under half of
    that turn's prompt cached: another prompt took its slot."""
    return turn["site"] == before["site"] and 2 * turn["cached_tokens"] < before["prompt_tokens"]


def losses(rows: list[dict], by_conversation: dict[str, list[dict]]) -> None:
    ends = {}
    for rs in by_conversation.values():
        rs = sorted(rs, key=lambda r: r["turn"])
        for a, b in zip(rs, rs[1:]):
            ends[id(a)] = b["sent_at"]
        ends[id(rs[-1])] = rs[-1]["sent_at"] + rs[-1]["ttft"] + 1.0
    load = {id(r): sum(1 for o in rows if o is not r and o["site"] == r["site"]
                       and o["sent_at"] < r["sent_at"] < ends[id(o)]) for r in rows}
    total = sum(r["prompt_tokens"] for r in rows)
    ceiling = 0
    lost: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    found: collections.Counter[str] = collections.Counter()
    slot_lost = 0
    for rs in by_conversation.values():
        rs = sorted(rs, key=lambda r: r["turn"])
        found[rs[0]["outcome"]] += rs[0]["cached_tokens"]
        for a, b in zip(rs, rs[1:]):
            best = min(a["prompt_tokens"], b["prompt_tokens"])
            ceiling += best
            kind = f"{'moved' if a['site'] != b['site'] else 'stayed'}, {b['outcome']}, load {load[id(b)]}"
            lost[kind] += max(0, best - b["cached_tokens"])
            count[kind] += 1
            if lost_its_slot(a, b):
                slot_lost += max(0, best - b["cached_tokens"])
    cached = sum(r["cached_tokens"] for r in rows)
    print(f"cached {100 * cached / total:.1f}% of {total} prompt tokens; the ceiling from history is "
          f"{100 * ceiling / total:.1f}%")
    for kind, tokens in sorted(lost.items(), key=lambda kv: -kv[1]):
        if tokens:
            print(f"  lost {100 * tokens / total:4.1f} points in {count[kind]} later turns ({kind})")
    print(f"  of all later turns' losses, {100 * slot_lost / total:.1f} points in turns that lost their slot "
          f"(stayed on their engine and found under half of their turn before)")
    for outcome, tokens in sorted(found.items(), key=lambda kv: -kv[1]):
        if tokens:
            print(f"  found {100 * tokens / total:4.1f} points in first turns ({outcome})")


def burst_at_the_gateway(rows: list[dict]) -> None:
    """The opening burst's first turns (sent in the run's first `BURST_SECONDS`), engine
    by engine, in the order they reached the gateway, with the milliseconds between them
    there (its log's head time less latency: when each came in; a held or spaced one went
    later)."""
    start = min(r["sent_at"] for r in rows)
    by_site: dict[str, list[dict]] = collections.defaultdict(list)
    for row in sorted(rows, key=lambda r: r["arrived"]):
        if row["turn"] == 0 and row["sent_at"] - start < BURST_SECONDS:
            by_site[row["site"]].append(row)
    parts = []
    for site, rs in sorted(by_site.items()):
        gaps = [f"{1000 * (b['arrived'] - a['arrived']):.0f} ms" for a, b in zip(rs, rs[1:])]
        parts.append(f"{site}: " + " then ".join(str(r["prompt_tokens"]) for r in rs)
                     + (f" tokens, {', '.join(gaps)} apart" if gaps else " tokens"))
    print("opening burst at the gateway: " + "; ".join(parts))


def main() -> None:
    out, run = Path(sys.argv[1]), sys.argv[2]
    rows = turns(out, run)
    by_conversation = collections.defaultdict(list)
    for row in rows:
        by_conversation[row["conversation"]].append(row)
    for conversation, rs in by_conversation.items():
        print(conversation, " | ".join(
            f"turn {r['turn'] + 1} {r['site']} {r['outcome']} {r['cached_tokens']}/{r['prompt_tokens']}"
            for r in sorted(rs, key=lambda r: r["turn"])))
    first = {c: min(r["sent_at"] for r in rs) for c, rs in by_conversation.items()}
    last = {c: max(r["sent_at"] for r in rs) for c, rs in by_conversation.items()}
    sites = sorted({r["site"] for r in rows})
    home: dict[str, str] = {}
    busier: collections.Counter[str] = collections.Counter()
    for row in sorted(rows, key=lambda r: r["sent_at"]):
        if row["turn"] == 0:
            # Live: started before this one and with a turn still to come (within a second).
            live = collections.Counter(home[c] for c in home if first[c] < row["sent_at"] <= last[c] + 1)
            if live[row["site"]] > min(live[s] for s in sites):
                busier[row["outcome"]] += 1
        home[row["conversation"]] = row["site"]
    losses(rows, by_conversation)
    moved = sum(len({r["site"] for r in rs}) > 1 for rs in by_conversation.values())
    print(f"{moved} of {len(by_conversation)} conversations answered on more than one engine; "
          f"{sum(busier.values())} of {len(by_conversation)} started on an engine with more live conversations than another"
          + (f" ({', '.join(f'{o} {n}' for o, n in sorted(busier.items()))})" if busier else ""))
    # A later turn that stayed on its engine but found under half of its turn before: its
    # slot went to another prompt. The new conversations sent to that engine since its turn
    # before are the likely takers (llama.cpp gives a new request the idle slot sharing the
    # longest prefix with it).
    for rs in by_conversation.values():
        rs = sorted(rs, key=lambda r: r["turn"])
        for a, b in zip(rs, rs[1:]):
            if not lost_its_slot(a, b):
                continue
            takers = [o for o in rows if o["turn"] == 0 and o["site"] == b["site"]
                      and a["sent_at"] < o["sent_at"] < b["sent_at"] + 1]
            print(f"lost its slot: {b['conversation']} turn {b['turn'] + 1} {b['site']} "
                  f"{b['cached_tokens']}/{b['prompt_tokens']} ({b['ttft']:.1f} s); first turns sent there since "
                  f"its turn before: " + (", ".join(
                      f"{o['conversation']} {o['sent_at'] - b['sent_at']:+.2f} s {o['outcome']} "
                      f"{o['cached_tokens']}/{o['prompt_tokens']}" for o in takers) or "none"))
    burst_at_the_gateway(rows)
    print(f"heads verdict changes: {verdicts(out, run, rows)}")
    slowest = sorted(rows, key=lambda r: r["ttft"], reverse=True)[:5]
    print("slowest turns (TTFT, turn, engine, outcome, cached/prompt tokens): " + " | ".join(
        f"{r['ttft']:.1f} s turn {r['turn'] + 1} {r['site']} {r['outcome']} {r['cached_tokens']}/{r['prompt_tokens']}"
        for r in slowest))


if __name__ == "__main__":
    main()
