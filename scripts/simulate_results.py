"""The runs behind docs/routing.md, printed as the Markdown tables the page holds.

Run it through `scripts/simulate-results`, which builds the simulator first. Each
table is one or more `grid-route-simulate --json` runs on the bundled trace (seed 1, but
seeds 1 to 8 in the `seeds`, `free_slot_wait` and `answers` sections, and those seeds at
five engine speeds in `speeds`); the command of
every run is printed above its table. A fourth argument names the sections to print,
comma-separated (`defaults,rules,placement,seeds,streams,replicas,window,sessions,one_line,
free_slot_wait,tuned,answers,speeds`); all of them by default. The `tuned` section compares this build with
an older one when OLD_SIMULATOR names that build's simulator (OLD_NAME, how the table names
it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

BIN, TRACE, IMG = sys.argv[1], sys.argv[2], sys.argv[3]
SECTIONS = sys.argv[4].split(",") if len(sys.argv) > 4 else None

# The slot engine the bundled trace is replayed on: eight llama.cpp-style slots per engine,
# each prefilling 10,000 and decoding 50 tokens a second, and a host prompt cache of 65,536
# tokens (llama.cpp's default --cache-ram of 8 GiB at Llama-3.1-8B's 128 KiB a token).
SLOTS = ["--engine", "slots", "--slots", "8", "--prefill-tps", "10000", "--decode-tps", "50",
         "--host-cache-tokens", "65536"]
KINDS = {"batching": [], "slots": SLOTS}
# The same slot engine with its slots sharing one prefill line (`--one-prefill-at-a-time`), at
# eight times the speed: what its eight slots prefill together when all of them do.
ONE_LINE = ["--engine", "slots", "--slots", "8", "--prefill-tps", "80000", "--decode-tps", "50",
            "--host-cache-tokens", "65536", "--one-prefill-at-a-time"]
POLICIES_COMPARED = ("round-robin", "least-queue", "cache-aware", "chwbl")
# The index without the contract's bounds: 64 times its 16,384 keys a cluster and a 2-hour
# TTL instead of 600 s (the bundled trace lasts 59 minutes), so nothing is evicted or expires.
UNBOUNDED = ["--capacity", "1048576", "--ttl-secs", "7200"]
# The grid shapes the seed and slot tables run, each as its label and the flags beyond
# `--sites` (the label's first number).
SHAPES = (("4", []), ("8", []), ("16", []),
          ("8, 4 replicas sharing one index", ["--replicas", "4", "--shared-index"]))


def simulate(*flags: str, quiet: bool = False, binary: str | None = None) -> dict:
    command = [binary or BIN, "--trace", TRACE, "--json", *flags]
    if not quiet:
        print(f"<!-- {' '.join(['grid-route-simulate', *command[1:]])} -->")
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def mark(ok: bool) -> str:
    """A verdict as the tables print it: a miss in bold."""
    return "yes" if ok else "**no**"


def hundredths(result: dict) -> str:
    """Hit share to the hundredth / TTFT p50 / p99, one policy's cell."""
    return (f"{100 * result['hit_share']:.2f}% / {result['ttft_p50_s']:.3f} / "
            f"{result['ttft_p99_s']:.3f} s")


def row(result: dict) -> str:
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(result["outcomes"].items()) if v)
    return (f"| {result['policy']} | {100 * result['hit_share']:.1f}% | {result['ttft_p50_s']:.3f} s "
            f"| {result['ttft_p90_s']:.3f} s | {result['ttft_p99_s']:.3f} s "
            f"| {result['max_over_mean_requests']:.2f} | {outcomes} |")


def bar(results: list[dict]) -> tuple[bool, float, bool, float, bool]:
    """The bar grid-route is held to: hit share at least cache-aware's, TTFT p50 and p99
    within 5% of the best of the four compared policies. Returns whether the hit share
    holds, then each TTFT ratio to the best other with whether it holds."""
    by = {r["policy"]: r for r in results}
    grid = by["grid-route"]
    others = [by[p] for p in POLICIES_COMPARED if p in by]
    p50 = grid["ttft_p50_s"] / min(r["ttft_p50_s"] for r in others)
    p99 = grid["ttft_p99_s"] / min(r["ttft_p99_s"] for r in others)
    return grid["hit_share"] >= by["cache-aware"]["hit_share"], p50, p50 <= 1.05, p99, p99 <= 1.05


def verdict(results: list[dict]) -> str:
    """Whether grid-route meets the bar (see `bar`), as a sentence under its table."""
    hit, p50_ratio, p50, p99_ratio, p99 = bar(results)
    return (f"grid-route: hit share ≥ cache-aware's: {mark(hit)}; TTFT p50 {p50_ratio:.2f}× "
            f"the best other ({mark(p50)}); p99 {p99_ratio:.2f}× ({mark(p99)})")


def table(report: dict) -> None:
    print("| policy | hit share | TTFT p50 | p90 | p99 | max/mean requests | outcomes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for result in report["results"]:
        print(row(result))
    print()
    print(verdict(report["results"]))
    print()


def defaults() -> None:
    print("## At the defaults\n")
    for kind, flags in KINDS.items():
        for sites in (4, 8, 16):
            print(f"### {kind} engines, {sites} sites, one replica\n")
            svg = f"simulate-{kind}-{sites}-sites.svg"
            table(simulate("--sites", str(sites), *flags, "--plot", f"{IMG}/{svg}"))
            print(f"![TTFT CDF, {kind} engines, {sites} sites](img/{svg})\n")
        print(f"### {kind} engines, 8 sites, 4 replicas sharing one index\n")
        table(simulate("--sites", "8", "--replicas", "4", "--shared-index", *flags))



def rules() -> None:
    print("## grid-route before the defaults learned, and the explicit rules' cost\n")
    print("Hit share / TTFT p50 / p99 of grid-route alone. *Before*: vLLM's gauge as the only")
    print("signal is what the old defaults read on these engines; the rows set the old")
    print("queue window, queues alone, the fixed prices, exploration of later turns, no threads")
    print("and, on slot engines, a request that matches nothing placed by load first.")
    print("*Threshold*: the 80% rule at 0.5 and 0.3, everything else at the defaults.")
    print("*Index without bounds*: 64 times the contract's 16,384 keys a cluster and a 2-hour")
    print("TTL instead of 600 s (the trace lasts 59 minutes): what the index's size and age")
    print("limits cost. *No exploration*: the contract's 2% at 0, which also takes the seed's")
    print("draw out of grid-route's run. Hit shares to the hundredth, to set against")
    print("cache-aware's in the tables above.\n")
    print("| engines | sites | defaults | before (10 s window, queues alone, 10000 tok/s, 2 s, "
          "later turns explored, no threads, misses by load) "
          "| threshold 0.5 | threshold 0.3 | engine_feedback off | index without bounds "
          "| no exploration |")
    print("|---|---:|---|---|---|---|---|---|---|")
    variants = [
        [],
        ["--count-in-flight", "false", "--queue-window-secs", "10", "--prefill-price", "10000",
         "--queued-request-seconds", "2", "--explore-continuations", "--no-threads",
         "--misses-by-load"],
        ["--threshold", "0.5"],
        ["--threshold", "0.3"],
        ["--engine-feedback", "false"],
        UNBOUNDED,
        ["--exploration", "0"],
    ]
    for kind, flags in KINDS.items():
        for sites in (4, 8, 16):
            cells = []
            for variant in variants:
                r = simulate("--sites", str(sites), "--policies", "grid-route", *flags, *variant)["results"][0]
                cells.append(f"{100 * r['hit_share']:.2f}% / {r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f} s")
            print(f"| {kind} | {sites} | " + " | ".join(cells) + " |")
    print()



def streams() -> None:
    print("## Streams, the gate's two sides and exploration\n")
    print("Hit share / TTFT p50 / p99 of grid-route alone, each default against what it")
    print("replaced, everything else at the defaults: a request in flight counting whole until")
    print("its answer ends (`--streams-count-whole`), a slot engine's streams counting at half")
    print("even while its slots are full (`--slots-unknown`; batching engines have no slots),")
    print("the load gate counting a moved match's prefill once at learned prices")
    print("(`--moved-prefill-payers 1`), exploration drawing for a conversation's later turns")
    print("too (`--explore-continuations`), the first, third and fourth together (streams")
    print("counted whole leave nothing for the slots to change), and on slot engines a request")
    print("that matches nothing sent by load first instead of to a free slot where the index holds")
    print("least (`--misses-by-load`; batching engines are placed by load either")
    print("way), free slots ranked first by how much of the prompt each engine holds, a shared")
    print("head too short to stick included, before the room (`--free-slots-by-depth`), and a")
    print("later turn naming no thread (`--no-threads`, see \"Threads and sessions\").")
    print("The last column is the bar: cache-aware's hit share, and the best TTFT p50 and")
    print("p99 of round-robin, least-queue, cache-aware and chwbl.\n")
    print("| engines | sites | defaults | streams whole | slots unknown | prefill once "
          "| later turns explored | all three | misses by load | free slots by depth | no threads | bar |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    variants = [
        [],
        ["--streams-count-whole"],
        ["--slots-unknown"],
        ["--moved-prefill-payers", "1"],
        ["--explore-continuations"],
        ["--streams-count-whole", "--moved-prefill-payers", "1", "--explore-continuations"],
        ["--misses-by-load"],
        ["--free-slots-by-depth"],
        ["--no-threads"],
    ]
    cell = lambda r: f"{100 * r['hit_share']:.1f}% / {r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f} s"
    for kind, flags in KINDS.items():
        for sites, shape in ((4, []), (8, []), (16, []), (8, ["--replicas", "4", "--shared-index"])):
            base = ["--sites", str(sites), *shape, *flags]
            others = simulate(*base, "--policies", ",".join(POLICIES_COMPARED))["results"]
            by = {r["policy"]: r for r in others}
            bar = (f"{100 * by['cache-aware']['hit_share']:.1f}% / "
                   f"{min(r['ttft_p50_s'] for r in others):.3f} / "
                   f"{min(r['ttft_p99_s'] for r in others):.3f} s")
            cells = [cell(simulate(*base, "--policies", "grid-route", *v)["results"][0]) for v in variants]
            label = f"{sites}" + (" (4 replicas, shared index)" if shape else "")
            print(f"| {kind} | {label} | " + " | ".join(cells) + f" | {bar} |")
    print()


def replicas() -> None:
    print("## Replicas: own index or shared\n")
    print("Hit share / TTFT p50 of every policy, batching engines; *shared* changes grid-route only.\n")
    print("| sites | replicas | grid-route, own index | grid-route, shared index | round-robin "
          "| least-queue | cache-aware | chwbl | oracle |")
    print("|---:|---:|---|---|---|---|---|---|---|")
    for sites in (4, 8, 16):
        for replicas in (1, 2, 4, 8):
            own = {r["policy"]: r for r in simulate("--sites", str(sites), "--replicas", str(replicas))["results"]}
            shared = simulate("--sites", str(sites), "--replicas", str(replicas), "--shared-index",
                              "--policies", "grid-route")["results"][0]
            cell = lambda r: f"{100 * r['hit_share']:.1f}% / {r['ttft_p50_s']:.3f} s"
            cells = [cell(own["grid-route"]), cell(shared)] + [
                cell(own[p]) for p in ("round-robin", "least-queue", "cache-aware", "chwbl", "oracle")]
            print(f"| {sites} | {replicas} | " + " | ".join(cells) + " |")
    print()



def window() -> None:
    print("## The queue window\n")
    print("grid-route and least-queue at each `--queue-window-secs`, hit share / TTFT p50 / p90.\n")
    print("| engines | sites | window | grid-route | least-queue |")
    print("|---|---:|---:|---|---|")
    for kind, flags in KINDS.items():
        for sites in (4, 8, 16):
            for window in (1, 2, 5, 10):
                by = {r["policy"]: r for r in simulate(
                    "--sites", str(sites), "--policies", "grid-route,least-queue",
                    "--queue-window-secs", str(window), *flags)["results"]}
                cell = lambda r: f"{100 * r['hit_share']:.1f}% / {r['ttft_p50_s']:.3f} / {r['ttft_p90_s']:.3f} s"
                print(f"| {kind} | {sites} | {window} s | {cell(by['grid-route'])} | {cell(by['least-queue'])} |")
    print()


def sessions() -> None:
    print("## Threads and sessions\n")
    print("The Mooncake trace carries no conversation id, so conversations are derived: a")
    print("request whose blocks begin with an earlier request's whole prompt continues it, each")
    print("request continued at most once, and a request whose full blocks end at a block an")
    print("earlier request went past (a head many share, such as the system-prompt block every")
    print("request here begins with) is continued by none, since the trace cannot tell its next")
    print("turn from another conversation's first: 8,108 conversations, 2,023 of two turns or more")
    print("holding 5,946 of the 12,031 requests (`derive_continued`'s unit test checks these")
    print("counts). Linking such a request to the first one extending it, as the simulator did")
    print("before 3796cbe (6,745 conversations, 2,838 of two turns or more holding 8,124 requests,")
    print("in this page's history), sent that one back to where an unrelated request was answered,")
    print("which a gateway's thread never does. At the defaults a continuing request names the")
    print("thread of the one it continues, as a gateway keys it from a history sent back as it")
    print("was; `--no-threads` names none (a client that rewrites its history at each turn);")
    print("`--sessions` adds the conversation's session, as a client sending `prompt_cache_key`")
    print("would. Hit share / TTFT p50 / p99; the last two columns count grid-route's `session`")
    print("decisions at the defaults and with `--sessions`.\n")
    print("| engines | sites | grid-route | grid-route, no threads | grid-route, sessions "
          "| cache-aware | session decisions | with sessions |")
    print("|---|---:|---|---|---|---|---:|---:|")
    for kind, flags in KINDS.items():
        for sites in (4, 8, 16):
            plain = {r["policy"]: r for r in simulate(
                "--sites", str(sites), "--policies", "grid-route,cache-aware", *flags)["results"]}
            no_threads = simulate("--sites", str(sites), "--policies", "grid-route",
                                  "--no-threads", *flags)["results"][0]
            with_sessions = simulate("--sites", str(sites), "--policies", "grid-route", "--sessions",
                                     *flags)["results"][0]
            cell = lambda r: f"{100 * r['hit_share']:.1f}% / {r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f} s"
            decided = lambda r: r["outcomes"].get("session", 0)
            print(f"| {kind} | {sites} | {cell(plain['grid-route'])} | {cell(no_threads)} "
                  f"| {cell(with_sessions)} | {cell(plain['cache-aware'])} "
                  f"| {decided(plain['grid-route'])} | {decided(with_sessions)} |")
    print()


def placement() -> None:
    print("## Where the hit share is lost\n")
    print("Hit share / held anywhere / max/mean requests, one replica. *Held anywhere* is the")
    print("prompt the engine holding the most of each request would have served from cache had")
    print("the request started there when it arrived (a slot engine with every slot busy counts")
    print("as holding nothing, so with full slots it reads under the hit share). A hit share")
    print("under it is requests sent past the engine that held their prompt; a low one is")
    print("prompts no engine held any more because of where earlier requests went. *No gate*:")
    print("a queued request priced at 1 ms, so no holder's load outweighs its match. *Misses by")
    print("load*: a request that matches nothing sent by load first on slot engines (the rule")
    print("before; batching engines are placed so either way).\n")
    print("| engines | sites | grid-route | grid-route, threshold 0.05, no gate, no feedback "
          "| grid-route, misses by load | least-queue | cache-aware |")
    print("|---|---:|---|---|---|---|---|")
    sticks = ["--threshold", "0.05", "--queued-request-seconds", "0.001", "--engine-feedback", "false"]
    for kind, flags in KINDS.items():
        for sites in (4, 8, 16):
            by = {r["policy"]: r for r in simulate(
                "--sites", str(sites), "--policies", "grid-route,least-queue,cache-aware", *flags)["results"]}
            stuck = simulate("--sites", str(sites), "--policies", "grid-route", *flags, *sticks)["results"][0]
            by_load = simulate("--sites", str(sites), "--policies", "grid-route", *flags,
                               "--misses-by-load")["results"][0]
            cell = lambda r: (f"{100 * r['hit_share']:.1f}% / {100 * r['held_anywhere_share']:.1f}% "
                              f"/ {r['max_over_mean_requests']:.2f}")
            print(f"| {kind} | {sites} | {cell(by['grid-route'])} | {cell(stuck)} | {cell(by_load)} "
                  f"| {cell(by['least-queue'])} | {cell(by['cache-aware'])} |")
    print()


def one_line() -> None:
    """Every policy on slot engines whose slots share one prefill line, with grid-route's
    request that matches nothing placed by load first next to its default (a free slot where
    the index holds least)."""
    print("## Slots sharing one prefill line\n")
    print("Hit share / TTFT p50 / p99 of each policy at the defaults on the slot engine above with")
    print("`--one-prefill-at-a-time` at 80,000 tokens a second (its eight slots' 10,000 each, now")
    print("shared); *misses by load* as in \"Where the hit share is lost\". The last column is")
    print("grid-route's bar, as under the tables at the defaults.\n")
    print("| sites | grid-route | grid-route, misses by load | round-robin | least-queue | cache-aware "
          "| chwbl | grid-route: hit share ≥ cache-aware's; TTFT p50, p99 against the best other |")
    print("|---|---|---|---|---|---|---|---|")
    for sites, extra in SHAPES:
        run = ["--sites", sites.split(",")[0], *extra, *ONE_LINE]
        results = simulate(*run, "--policies", "grid-route,round-robin,least-queue,cache-aware,chwbl")["results"]
        by = {r["policy"]: r for r in results}
        by_load = simulate(*run, "--policies", "grid-route", "--misses-by-load")["results"][0]
        hit, p50_ratio, p50, p99_ratio, p99 = bar(results)
        print(f"| {sites} | {hundredths(by['grid-route'])} | {hundredths(by_load)} | "
              + " | ".join(hundredths(by[p]) for p in POLICIES_COMPARED)
              + f" | {mark(hit)}; {p50_ratio:.2f}× ({mark(p50)}), {p99_ratio:.2f}× ({mark(p99)}) |")
    print()


def free_slot_wait() -> None:
    """grid-route at the defaults but for the wait a free slot may cost a new conversation
    (`--free-slot-wait-factor`), on both slot engines (side by side, one prefill line), under
    seeds 1 to 8: how each factor holds the bar and what it does to TTFT."""
    factors = ("2", "4", "6", "8", "inf")
    print("## The wait a free slot may cost\n")
    print("grid-route with `--free-slot-wait-factor` at each value, the rest at the defaults, under")
    print("seeds 1 to 8, on the slot engines of the tables above (slots side by side) and on")
    print("slots sharing one prefill line (as in \"Slots sharing one prefill line\"). Each cell:")
    print("the seeds where the whole bar holds / where the hit share is at least cache-aware's;")
    print("grid-route's median hit share; TTFT p50 / p99 against the best other policy, each at its")
    print("worst seed. 6 is the default; `inf` is the rule before (room alone).\n")
    print("| slots | sites | " + " | ".join(f"factor {f}" + (" (default)" if f == "6" else "")
                                     for f in factors) + " |")
    print("|---|---|" + "---|" * len(factors))
    for kind, flags in (("side by side", SLOTS), ("one prefill line", ONE_LINE)):
        for sites, extra in SHAPES:
            run = ["--sites", sites.split(",")[0], *extra, *flags]
            others = ["--policies", ",".join(POLICIES_COMPARED)]
            grid = ["--policies", "grid-route", "--free-slot-wait-factor", "X"]
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run + others)} --seed N, N = 1 to 8 -->")
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run + grid)} --seed N, "
                  f"N = 1 to 8, X = {', '.join(factors)} -->")
            compared = [simulate(*run, *others, "--seed", str(seed), quiet=True)["results"]
                        for seed in range(1, 9)]
            cells = []
            for factor in factors:
                holds, hits, shares, p50s, p99s = 0, 0, [], [], []
                for seed in range(1, 9):
                    results = simulate(*run, *grid[:-1], factor, "--seed", str(seed),
                                       quiet=True)["results"] + compared[seed - 1]
                    hit, p50_ratio, p50, p99_ratio, p99 = bar(results)
                    hits += hit
                    holds += hit and p50 and p99
                    shares.append(results[0]["hit_share"])
                    p50s.append(p50_ratio)
                    p99s.append(p99_ratio)
                cells.append(f"{holds} / {hits}; {100 * statistics.median(shares):.2f}%; "
                             f"{max(p50s):.2f}× / {max(p99s):.2f}×")
            print(f"| {kind} | {sites} | " + " | ".join(cells) + " |")
    print()


# Hand-tuned settings from before the defaults learned (the gateway's requests counted in the
# load, a 1 s queue window, a queued request at 0.5 s, the 80% rule at 0.3, no exploration):
# what an operator who tuned the gateway then still runs.
TUNED = ["--count-in-flight", "true", "--queue-window-secs", "1", "--queued-request-seconds", "0.5",
         "--threshold", "0.3", "--exploration", "0"]


def tuned() -> None:
    """grid-route with the hand-tuned settings at this build and, when the environment names
    an older build's simulator (OLD_SIMULATOR), at that build: whether the settings an operator
    tuned before the defaults learned do at least as well now. The engine models are the
    simulator's own, so the older build's must give the policies outside the gateway the same
    figures; the section checks that on every shape before it prints a row."""
    old = os.environ.get("OLD_SIMULATOR")
    old_name = os.environ.get("OLD_NAME", "the older build")
    print("## The hand-tuned settings, this build against an older one\n")
    print(f"Hit share / TTFT p50 / p99 of grid-route with `{' '.join(TUNED)}`, at this build")
    print(f"and at {old_name} (`OLD_SIMULATOR`), and at this build's defaults. Seed 1; with")
    print("exploration at 0 only the replicas draw. The last column: the tuned hit share at")
    print("least the older build's, and the TTFT ratios to the older build's.\n")
    print(f"| engines | sites | tuned, this build | tuned, {old_name} | defaults, this build "
          "| tuned: hit share ≥ before's; TTFT p50, p99 against before's |")
    print("|---|---|---|---|---|---|")
    # least-queue runs through the gateway model, which changes between builds.
    policies = ["--policies", "grid-route,round-robin,cache-aware,chwbl", *TUNED]
    figures = lambda results: [(r["policy"], r["hit_share"], r["ttft_p50_s"], r["ttft_p99_s"])
                               for r in results[1:]]
    for kind, flags in KINDS.items():
        for sites, extra in SHAPES:
            run = ["--sites", sites.split(",")[0], *extra, *flags]
            now = simulate(*run, *policies)["results"]
            defaults = simulate(*run, "--policies", "grid-route")["results"][0]
            if old is None:
                print(f"| {kind} | {sites} | {hundredths(now[0])} | not run | {hundredths(defaults)} |  |")
                continue
            print(f"<!-- OLD_SIMULATOR: grid-route-simulate --trace {TRACE} --json "
                  f"{' '.join(run + policies)} -->")
            before = simulate(*run, *policies, quiet=True, binary=old)["results"]
            if figures(now) != figures(before):
                sys.exit(f"{old}: the engine model differs from this build's ({kind}, {sites} sites)")
            now, was = now[0], before[0]
            print(f"| {kind} | {sites} | {hundredths(now)} | {hundredths(was)} | {hundredths(defaults)} "
                  f"| {mark(now['hit_share'] >= was['hit_share'])}; "
                  f"{now['ttft_p50_s'] / was['ttft_p50_s']:.2f}×, "
                  f"{now['ttft_p99_s'] / was['ttft_p99_s']:.2f}× |")
    print()


def seeds() -> None:
    """The defaults' runs again under seeds 1 to 8: the seed draws grid-route's 2%
    exploration (and, behind replicas, which replica takes each request), so the bar's
    verdict at seed 1 is one draw of several."""
    print("## The bar under other draws\n")
    print("Every policy at the defaults under seeds 1 to 8 (seed 1 is the tables above). Hit")
    print("shares are the lowest, the median and the highest of the 8 runs; *bar holds* counts")
    print("the seeds where grid-route meets the whole bar, *hit share* those where its hit share")
    print("is at least cache-aware's; TTFT is grid-route's ratio to the best other policy, each")
    print("the worst of the 8 seeds. *Without bounds*: grid-route's hit share again with the")
    print("index's bounds lifted as in \"index without bounds\" above (64 times the keys, a")
    print("2-hour TTL), and the seeds where it is at least cache-aware's: whether the contract's")
    print("size and age limits are what a draw that misses hangs on.\n")
    print("| engines | sites | grid-route hit share | cache-aware hit share | hit share ≥ cache-aware's | bar holds | TTFT p50 / p99, each at its worst seed | without bounds: hit share, ≥ cache-aware's |")
    print("|---|---|---|---|---:|---:|---|---|")
    spread = lambda xs: f"{100 * min(xs):.2f} / {100 * statistics.median(xs):.2f} / {100 * max(xs):.2f}%"
    unbounded = ["--policies", "grid-route", *UNBOUNDED]
    for kind, flags in KINDS.items():
        for sites, extra in SHAPES:
            run = ["--sites", sites.split(",")[0], *extra, *flags]
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run)} --seed N, N = 1 to 8 -->")
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run + unbounded)} --seed N, N = 1 to 8 -->")
            grid, ca, hits, holds, p50s, p99s = [], [], 0, 0, [], []
            unbounded_shares, unbounded_hits = [], 0
            for seed in range(1, 9):
                results = simulate(*run, "--seed", str(seed), quiet=True)["results"]
                by = {r["policy"]: r for r in results}
                grid.append(by["grid-route"]["hit_share"])
                ca.append(by["cache-aware"]["hit_share"])
                unbounded_shares.append(
                    simulate(*run, *unbounded, "--seed", str(seed), quiet=True)["results"][0]["hit_share"])
                unbounded_hits += unbounded_shares[-1] >= ca[-1]
                hit, p50_ratio, p50, p99_ratio, p99 = bar(results)
                hits += hit
                holds += hit and p50 and p99
                p50s.append(p50_ratio)
                p99s.append(p99_ratio)
            print(f"| {kind} | {sites} | {spread(grid)} | {spread(ca)} | {hits} of 8 | {holds} of 8 "
                  f"| {max(p50s):.2f}× / {max(p99s):.2f}× | {spread(unbounded_shares)}, {unbounded_hits} of 8 |")
    print()


def with_prefill(flags: list[str], kind: str, share: float) -> list[str]:
    """`flags` with the engines' prefill speed at `share` of the table's (20,000 tokens a
    second on batching engines, the simulator's default; 10,000 on slot engines)."""
    speed = round((10000 if kind == "slots" else 20000) * share)
    if "--prefill-tps" in flags:
        at = flags.index("--prefill-tps")
        return [*flags[:at + 1], str(speed), *flags[at + 2:]]
    return [*flags, "--prefill-tps", str(speed)]


# The engines' prefill speed in `speeds`, as shares of the table's.
SPEED_SHARES = (0.98, 0.99, 1.0, 1.01, 1.02)


def speeds() -> None:
    """The defaults' runs again under seeds 1 to 8 and the engines' prefill speed 2% either
    side of the table's: 40 draws of each shape, each policy's hit share moving with the
    timing of every load grid-route reads, not only with its own seed. grid-route is run
    again in the same draws with the contract's exploration off and with the load gate's
    moved prefill counted 2, 4 and 16 times or with the gate all but off: the evidence for
    `MOVED_PREFILL_PAYERS`."""
    from concurrent.futures import ThreadPoolExecutor

    print("## The bar under other engine speeds\n")
    print("The defaults again under seeds 1 to 8 and the engines' prefill speed at 98, 99, 100,")
    print("101 and 102% of the tables' (20,000 tokens a second on batching engines, 10,000 on")
    print("slot engines): 40 draws of each shape, for every policy. Hit shares are the lowest,")
    print("the median and the highest of the 40; *≥ cache-aware's* and *bar holds* count the draws")
    print("where grid-route's hit share is at least cache-aware's in the same draw, and where it")
    print("meets the whole bar. The other columns run grid-route again in the same 40 draws")
    print("(its median hit share, then the draws where the whole bar holds): with the contract's")
    print("2% exploration at 0; with the load gate counting a moved match's prefill 2 times (the")
    print("default before this build), 4 or 16 times instead of 8 (`--moved-prefill-payers`);")
    print("and with a queued request priced at 1 ms, so the gate all but never moves a match.\n")
    variants = {"no exploration": ["--exploration", "0"],
                "prefill twice": ["--moved-prefill-payers", "2"],
                "4 times": ["--moved-prefill-payers", "4"],
                "16 times": ["--moved-prefill-payers", "16"],
                "gate at its least": ["--queued-request-seconds", "0.001"]}
    print("| engines | sites | grid-route hit share | cache-aware hit share | ≥ cache-aware's | bar holds | "
          + " | ".join(variants) + " |")
    print("|---|---|---|---|---:|---:|" + "---|" * len(variants))
    spread = lambda xs: f"{100 * min(xs):.2f} / {100 * statistics.median(xs):.2f} / {100 * max(xs):.2f}%"
    compared = ["--policies", ",".join(("grid-route", *POLICIES_COMPARED))]
    totals = {name: 0 for name in ("defaults", *variants)}
    for kind, flags in KINDS.items():
        for sites, extra in SHAPES:
            run = ["--sites", sites.split(",")[0], *extra]
            speeds_said = "/".join(str(round((10000 if kind == "slots" else 20000) * x)) for x in SPEED_SHARES)
            for variant in ([], *variants.values()):
                engines = with_prefill(list(flags), kind, 1.0)
                at = engines.index("--prefill-tps") + 1
                engines[at] = "X"
                policies = compared if not variant else ["--policies", "grid-route"]
                print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run + engines + policies + variant)} "
                      f"--seed N, N = 1 to 8, X = {speeds_said} -->")
            draws = [(seed, share) for seed in range(1, 9) for share in SPEED_SHARES]

            def draw(at: tuple[int, float]) -> tuple[list[dict], dict[str, dict]]:
                seed, share = at
                engines = with_prefill(list(flags), kind, share)
                results = simulate(*run, *engines, *compared, "--seed", str(seed), quiet=True)["results"]
                alone = {name: simulate(*run, *engines, "--policies", "grid-route", *variant, "--seed",
                                        str(seed), quiet=True)["results"][0]
                         for name, variant in variants.items()}
                return results, alone

            with ThreadPoolExecutor(max_workers=2) as pool:
                drawn = list(pool.map(draw, draws))
            grid, ca, hits, holds = [], [], 0, 0
            alone = {name: ([], 0) for name in variants}
            for results, others in drawn:
                by = {r["policy"]: r for r in results}
                grid.append(by["grid-route"]["hit_share"])
                ca.append(by["cache-aware"]["hit_share"])
                hit, _, p50, _, p99 = bar(results)
                hits += hit
                holds += hit and p50 and p99
                for name, result in others.items():
                    hit, _, p50, _, p99 = bar([result, *[r for r in results if r["policy"] != "grid-route"]])
                    shares, held = alone[name]
                    alone[name] = ([*shares, result["hit_share"]], held + (hit and p50 and p99))
            totals["defaults"] += holds
            for name, (_, held) in alone.items():
                totals[name] += held
            cells = " | ".join(f"{100 * statistics.median(shares):.2f}%, {held} of 40"
                               for shares, held in alone.values())
            print(f"| {kind} | {sites} | {spread(grid)} | {spread(ca)} | {hits} of 40 | {holds} of 40 | {cells} |")
    print()
    print("The whole bar, of the 320 draws: " + ", ".join(f"{name} {held}" for name, held in totals.items()) + ".")
    print()


def answers() -> None:
    """The bar with the engines holding each turn's answer for the next (`--answers-cached
    true`) against the trace's whole blocks alone (the other tables), at seed 1 and over
    seeds 1 to 8."""
    print("## Answers held for the next turn\n")
    print("The bar on the engines of the tables above, as they are (a turn hits only the whole")
    print("trace blocks an engine holds) and with `--answers-cached true` (a continuing turn also")
    print("finds the earlier turn's partial last block and answer where that turn was served).")
    print("Each cell: grid-route's / cache-aware's hit share at seed 1, then whether the whole")
    print("bar holds there; the TTFT ratios are grid-route's to the best other policy. *Seeds 1")
    print("to 8*: the draws where the whole bar holds, blocks only / answers held. *No")
    print("exploration*: grid-route with the contract's 2% at 0, answers held, seed 1. *No")
    print("threads*: grid-route's hit share at seed 1 with `--no-threads`, blocks only / answers")
    print("held, to set against its hit share with threads in the first two columns.\n")
    print("| engines | sites | blocks only | answers held | answers held: TTFT p50 / p99 "
          "| seeds 1 to 8: bar holds, blocks only / answers held | answers held, no exploration: "
          "hit share, ≥ cache-aware's | no threads: hit share, blocks only / answers held |")
    print("|---|---|---|---|---|---|---|---|")
    held = ["--answers-cached", "true"]
    share = lambda by: f"{100 * by['grid-route']['hit_share']:.2f} / {100 * by['cache-aware']['hit_share']:.2f}%"
    for kind, flags in KINDS.items():
        for sites, extra in SHAPES:
            run = ["--sites", sites.split(",")[0], *extra, *flags]
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run)} [--answers-cached true] "
                  "--seed N, N = 1 to 8 -->")
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run + held)} "
                  "--policies grid-route --exploration 0 -->")
            print(f"<!-- grid-route-simulate --trace {TRACE} --json {' '.join(run)} [--answers-cached true] "
                  "--policies grid-route --no-threads -->")
            holds = {False: 0, True: 0}
            first = {}
            for answered in (False, True):
                for seed in range(1, 9):
                    results = simulate(*run, *(held if answered else []), "--seed", str(seed),
                                       quiet=True)["results"]
                    hit, p50_ratio, p50, p99_ratio, p99 = bar(results)
                    holds[answered] += hit and p50 and p99
                    if seed == 1:
                        first[answered] = ({r["policy"]: r for r in results},
                                           hit and p50 and p99, p50_ratio, p99_ratio)
            calm = simulate(*run, *held, "--policies", "grid-route", "--exploration", "0",
                            quiet=True)["results"][0]
            threadless = [simulate(*run, *(held if answered else []), "--policies", "grid-route",
                                   "--no-threads", quiet=True)["results"][0]["hit_share"]
                          for answered in (False, True)]
            (blocks, blocks_ok, _, _), (with_answers, ok, p50_ratio, p99_ratio) = first[False], first[True]
            print(f"| {kind} | {sites} | {share(blocks)}, {mark(blocks_ok)} | {share(with_answers)}, {mark(ok)} "
                  f"| {p50_ratio:.2f}× / {p99_ratio:.2f}× | {holds[False]} / {holds[True]} of 8 "
                  f"| {100 * calm['hit_share']:.2f}%, "
                  f"{mark(calm['hit_share'] >= with_answers['cache-aware']['hit_share'])} "
                  f"| {100 * threadless[0]:.2f} / {100 * threadless[1]:.2f}% |")
    print()


def main() -> None:
    sections = {"defaults": defaults, "rules": rules, "placement": placement, "seeds": seeds, "streams": streams,
                "replicas": replicas, "window": window, "sessions": sessions, "one_line": one_line,
                "free_slot_wait": free_slot_wait, "tuned": tuned, "answers": answers, "speeds": speeds}
    for name, section in sections.items():
        if SECTIONS is None or name in SECTIONS:
            section()


if __name__ == "__main__":
    main()
