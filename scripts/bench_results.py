"""The Markdown tables of BENCHMARKS.md from criterion's estimates of the last run.

Run it through `scripts/bench-results`, which runs the benches first. Arguments name the
benches to print (keying, routing, pin). A bench id `group/name` is read from
`target/criterion/<group>/<name with / as _>/new/estimates.json`, a top-level id from
`target/criterion/<id with / as _>/...`; times are criterion's mean point estimates.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("CARGO_TARGET_DIR", "target")) / "criterion"


def mean_ns(*parts: str) -> float:
    path = ROOT.joinpath(*parts, "new", "estimates.json")
    return json.loads(path.read_text())["mean"]["point_estimate"]


def show(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def keying() -> None:
    print("| body | `keys` | `serde_skip` | `serde_value` | keys / skip | keys / value |")
    print("|---|---|---|---|---|---|")
    for body in ["chat_100k", "chat_100k_sorted", "messages_tools", "responses_items",
                 "chat_image_4m", "chat_20m"]:
        keys, skip, value = (mean_ns("keying", f"{body}_{kind}")
                             for kind in ("keys", "serde_skip", "serde_value"))
        print(f"| `{body}` | {show(keys)} | {show(skip)} | {show(value)} "
              f"| {keys / skip:.2f}× | {keys / value:.2f}× |")
    print()


def routing() -> None:
    reference = mean_ns("keying_chat_100k_keys")
    print(f"| bench id | time | vs. `keying/chat_100k/keys` in the same run ({show(reference)}) |")
    print("|---|---|---|")
    for bench in ["routing/decide_512x8", "routing/confirm_512"]:
        ns = mean_ns(bench.replace("/", "_"))
        print(f"| `{bench}` | {show(ns)} | {ns / reference:.3f}× |")
    print()


def pin() -> None:
    copy, copy_bytes = mean_ns("pin", "passthrough_copy_1m"), mean_ns("pin", "passthrough_copy_1m_bytes")
    mib = 1 << 20
    print("| bench id | time (mean) | throughput | vs. `passthrough_copy_1m` | vs. `passthrough_copy_1m_bytes` |")
    print("|---|---|---|---|---|")
    for bench in ["passthrough_copy_1m", "passthrough_copy_1m_bytes", "sse_rewrite_1m",
                  "sse_rewrite_1m_short_responses", "sse_rewrite_1m_id_in_every_event",
                  "json_rewrite_1m"]:
        ns = mean_ns("pin", bench)
        rate = mib / (ns / 1e9)
        shown = f"{rate / (1 << 30):.1f} GiB/s" if rate >= 1 << 30 else f"{rate / mib:.0f} MiB/s"
        print(f"| `pin/{bench}` | {show(ns)} | {shown} | {copy / ns:.2f}× | {copy_bytes / ns:.2f}× |")
    print()


TABLES = {"keying": keying, "routing": routing, "pin": pin}
for name in sys.argv[1:] or TABLES:
    print(f"<!-- scripts/bench-results {name} -->")
    TABLES[name]()
