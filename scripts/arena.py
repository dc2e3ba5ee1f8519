"""The arena: the same multi-turn ShareGPT workload through several routers in front of the
same kind of fresh real engines, compared on cached share and time to first token.

Run it through `scripts/arena`, which builds the pinned venv and the release gateway first;
BENCHMARKS.md ("Arena") documents the options, the method and the results.

Each run starts three fresh `llama-server` processes (SmolLM2-135M, one thread, two slots,
`--metrics`, no host prompt cache), one router in front of them, and replays the workload
from the official `openai` SDK, N conversations at a time, streaming every turn. The
history of a conversation is the recorded one (the dataset's answers, not the model's), so
every router sees byte-identical requests. Cached share is the sum of the engines' reported
`cached_tokens` over the sum of their `prompt_tokens`.

Network: the script only ever talks to 127.0.0.1, and checks it twice — an audit hook
refuses any connection or name lookup of its own that is not loopback, and a watcher reads
the sockets of every process it started (engines, routers, gateway) from /proc during each
run and fails the run if one of them is connected to anything but loopback.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

MODEL = "smollm2"
ENGINES = 3


def log(message: str) -> None:
    print(f"arena: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Loopback only.


def _is_loopback_host(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if host is None:
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _audit(event: str, args) -> None:
    # Our own sockets: every connect and every name lookup must be loopback. A host name
    # (even "localhost") is refused too, so nothing here ever asks a resolver.
    if event == "socket.connect":
        sock, address = args[0], args[1]
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback_host(address[0]):
            raise PermissionError(f"arena: refused a connection to {address[0]}: loopback only")
    elif event == "socket.getaddrinfo":
        if not _is_loopback_host(args[0]):
            raise PermissionError(f"arena: refused a name lookup of {args[0]!r}: loopback only")


def _proc_address(text: str):
    ip_hex, port_hex = text.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port_hex, 16)
    # /proc/net/*6 prints the address as four host-order (little-endian) 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words), int(port_hex, 16)


def _loopback_or_unset(address) -> bool:
    if address.is_loopback or address.is_unspecified:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped is not None and (mapped.is_loopback or mapped.is_unspecified)


class NetworkWatch:
    """Samples the sockets of a set of process trees and remembers any that reach past
    loopback (a remote address that is not loopback, or a listener on a non-loopback
    address)."""

    def __init__(self, roots: list[int]):
        self.roots = roots
        self.violations: list[str] = []
        self.sockets_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()

    def _tree(self) -> set[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        pids, todo = set(), list(self.roots)
        while todo:
            pid = todo.pop()
            if pid not in pids:
                pids.add(pid)
                todo.extend(children.get(pid, []))
        return pids

    def sample(self) -> None:
        inodes: set[int] = set()
        for pid in self._tree():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
        if not inodes:
            return
        for table in ("tcp", "tcp6", "udp", "udp6"):
            try:
                with open(f"/proc/net/{table}") as f:
                    lines = f.readlines()[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()
                inode = int(cols[9])
                if inode not in inodes:
                    continue
                self.sockets_seen.add(inode)
                local, _ = _proc_address(cols[1])
                remote, port = _proc_address(cols[2])
                listening = table.startswith("tcp") and cols[3] == "0A"
                if not _loopback_or_unset(remote) or (listening and not local.is_loopback):
                    self.violations.append(f"{table} {local} -> {remote}:{port}")

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self.sample()


# ---------------------------------------------------------------------------------------
# The workload.


def recover_records(path: Path) -> tuple[list[dict], bool]:
    """The complete records of a JSON array that may be cut off: parses record after
    record and stops at the first one that does not parse whole."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    i, n = text.index("[") + 1, len(text)
    records: list[dict] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return records, True
        if text[i] == "]":
            return records, False
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return records, True
        records.append(record)


def _mostly_ascii(text: str) -> bool:
    return sum(c.isascii() for c in text) >= 0.95 * len(text)


@dataclass
class Conversation:
    id: str
    system: str | None
    turns: list[tuple[str, str]]


def build_workload(records, args) -> tuple[list[Conversation], list[str]]:
    usable = []
    for record in records:
        msgs = record.get("conversations") or []
        turns = []
        for k in range(0, len(msgs) - 1, 2):
            human, gpt = msgs[k], msgs[k + 1]
            if human.get("from") != "human" or gpt.get("from") != "gpt":
                break
            question, answer = (human.get("value") or "").strip(), (gpt.get("value") or "").strip()
            if not question or not answer or not _mostly_ascii(question + answer):
                break
            turns.append((question[: args.message_chars], answer[: args.message_chars]))
        usable.append((record.get("id", "?"), turns))
    multi = [(rid, t) for rid, t in usable if len(t) >= 2]
    if len(multi) < args.conversations:
        sys.exit(f"arena: only {len(multi)} usable multi-turn conversations")
    chosen = multi[: args.conversations]
    # Three shared system prompts of about SYSTEM_CHARS characters (~1k tokens), written
    # from answers of single-turn records the conversations do not use.
    donors = [t[0][1] for rid, t in usable if len(t) == 1]
    systems, donor = [], iter(donors)
    for k in range(3):
        text = (
            f"You are assistant #{k + 1} of a support team. Answer briefly. "
            f"Reference notes for this team follow.\n\n"
        )
        while len(text) < args.system_chars:
            text += next(donor) + "\n\n"
        systems.append(text[: args.system_chars])
    conversations = [
        Conversation(rid, systems[i % 3] if i < args.shared else None, turns[: args.max_turns])
        for i, (rid, turns) in enumerate(chosen)
    ]
    random.Random(args.seed).shuffle(conversations)
    return conversations, systems


# ---------------------------------------------------------------------------------------
# Processes.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, urllib.error.URLError):
        return 0, ""


class Procs:
    """Processes this run started; stops each one (its process group) by id."""

    def __init__(self, out: Path):
        self.out = out
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        logf = open(self.out / f"{name}.log", "wb")
        proc = subprocess.Popen(
            argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env or child_env(),
        )
        self.procs.append((name, proc))
        return proc

    def pids(self) -> list[int]:
        return [p.pid for _, p in self.procs]

    def check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}; see {self.out}/{name}.log")

    def stop(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for _, p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NO_PROXY"] = env["no_proxy"] = "*"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def wait_ready(procs: Procs, urls: list[str], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        if any(http_get(u)[0] == 200 for u in urls):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s ({urls})")


def start_engines(procs: Procs, args, n: int = ENGINES) -> list[str]:
    urls = []
    for k in range(n):
        port = free_port()
        procs.start(f"engine{k}", [
            args.llama_server, "--host", "127.0.0.1", "--port", str(port),
            "--model", args.llama_model, "--alias", MODEL, "--metrics",
            "--threads", "1", "--threads-batch", "1", "--parallel", str(args.slots),
            "--ctx-size", str(args.ctx_size), "--cache-ram", str(args.cache_ram), "--seed", "7",
        ])
        urls.append(f"http://127.0.0.1:{port}")
    for k, url in enumerate(urls):
        wait_ready(procs, [f"{url}/health"], f"engine{k}")
    return urls


# ---------------------------------------------------------------------------------------
# Routers.


@dataclass
class RouterConfig:
    name: str
    label: str
    kind: str  # grid | sglang | vllm | direct
    policy: str = ""
    count_in_flight: bool = False
    threshold: float | None = None
    priced: bool = False
    # prefill_tokens_per_second: auto from the measured rate, and engine_feedback: true
    learned: bool = False
    # engine_feedback: false (it is on by default)
    no_feedback: bool = False
    # prefix_affinity.queued_request_seconds, when not the default
    queued_seconds: float | None = None
    # prefix_affinity.queued_request_seconds at the measured (or given) request time
    queued_measured: bool = False
    # A config naming only the grid: no queue block, no prefix_affinity block.
    defaults: bool = False
    # The client sends prompt_cache_key = the conversation's id (the official SDK's parameter).
    prompt_cache_key: bool = False
    # Runs the gateway given by --old-gateway (an older build) instead of this tree's.
    old: bool = False


# The prior of grid-learned when no prefill rate was measured or given.
LEARNED_PRIOR_FALLBACK = 100.0


def router_configs(prefill_rate: float | None, request_seconds: float | None) -> dict[str, RouterConfig]:
    rate = f"{prefill_rate:.0f} tok/s" if prefill_rate else "this CPU's rate"
    recommended = f"count_in_flight, prefill priced at {rate}"
    prior = f"{prefill_rate:.0f} tok/s" if prefill_rate else f"{LEARNED_PRIOR_FALLBACK:.0f} tok/s"
    held = f"{request_seconds:.0f} s" if request_seconds else "this CPU's request time"
    return {
        "grid-defaults": RouterConfig(
            "grid-defaults", "grid-route, defaults (a config naming only the grid)", "grid", defaults=True),
        "grid-defaults-pck": RouterConfig(
            "grid-defaults-pck", "grid-route, defaults, the client sends prompt_cache_key", "grid",
            defaults=True, prompt_cache_key=True),
        "grid-defaults-pck-old": RouterConfig(
            "grid-defaults-pck-old",
            "grid-route --old-gateway (an older build), defaults, the client sends prompt_cache_key", "grid",
            defaults=True, prompt_cache_key=True, old=True),
        "grid-defaults-old": RouterConfig(
            "grid-defaults-old", "grid-route --old-gateway (an older build), defaults", "grid",
            defaults=True, old=True),
        "grid-defaults-t0.3": RouterConfig(
            "grid-defaults-t0.3", "grid-route, defaults but threshold 0.3", "grid", defaults=True, threshold=0.3),
        "grid-defaults-nofeedback": RouterConfig(
            "grid-defaults-nofeedback", "grid-route, defaults but engine_feedback off", "grid", defaults=True,
            no_feedback=True),
        "grid-recommended": RouterConfig(
            "grid-recommended", f"grid-route, {recommended}, threshold 0.3, a queued request priced at {held}",
            "grid", count_in_flight=True, priced=True, threshold=0.3, queued_measured=True),
        "grid-recommended-old": RouterConfig(
            "grid-recommended-old",
            f"grid-route --old-gateway (an older build), {recommended}, threshold 0.3, "
            f"a queued request priced at {held}",
            "grid", count_in_flight=True, priced=True, threshold=0.3, queued_measured=True, old=True),
        "grid-recommended-auto": RouterConfig(
            "grid-recommended-auto",
            f"grid-route, count_in_flight, prefill learned (auto) from {prior}, threshold 0.3, "
            f"a queued request priced at {held}",
            "grid", count_in_flight=True, learned=True, threshold=0.3, queued_measured=True),
        "grid-priced": RouterConfig(
            "grid-priced", f"grid-route, {recommended}", "grid", count_in_flight=True, priced=True),
        "grid-t0.5": RouterConfig(
            "grid-t0.5", f"grid-route, {recommended}, threshold 0.5", "grid",
            count_in_flight=True, priced=True, threshold=0.5),
        "grid-t0.3": RouterConfig(
            "grid-t0.3", f"grid-route, {recommended}, threshold 0.3", "grid",
            count_in_flight=True, priced=True, threshold=0.3),
        "grid-t0.3-nofeedback": RouterConfig(
            "grid-t0.3-nofeedback", f"grid-route, {recommended}, threshold 0.3, engine_feedback off",
            "grid", count_in_flight=True, priced=True, threshold=0.3, no_feedback=True),
        "grid-t0.3-q6": RouterConfig(
            "grid-t0.3-q6", f"grid-route, {recommended}, threshold 0.3, a queued request priced at 6 s",
            "grid", count_in_flight=True, priced=True, threshold=0.3, queued_seconds=6),
        "grid-t0.3-q8": RouterConfig(
            "grid-t0.3-q8", f"grid-route, {recommended}, threshold 0.3, a queued request priced at 8 s",
            "grid", count_in_flight=True, priced=True, threshold=0.3, queued_seconds=8),
        "grid-t0.6": RouterConfig(
            "grid-t0.6", f"grid-route, {recommended}, threshold 0.6", "grid",
            count_in_flight=True, priced=True, threshold=0.6),
        "grid-nofeedback": RouterConfig(
            "grid-nofeedback", f"grid-route, {recommended}, engine_feedback off", "grid",
            count_in_flight=True, priced=True, no_feedback=True),
        "grid-learned": RouterConfig(
            "grid-learned", f"grid-route, count_in_flight, prefill learned (auto) from {prior}, "
            "engine_feedback", "grid", count_in_flight=True, learned=True),
        "vllm-cache_aware": RouterConfig("vllm-cache_aware", "vllm-router (cache_aware)", "vllm", "cache_aware"),
        "sglang-cache_aware": RouterConfig(
            "sglang-cache_aware", "sglang-router (cache_aware)", "sglang", "cache_aware"),
        "sglang-round_robin": RouterConfig(
            "sglang-round_robin", "sglang-router (round_robin)", "sglang", "round_robin"),
    }


def start_router(procs: Procs, cfg: RouterConfig, engines: list[str], args, out: Path):
    """Starts the router; returns (its base URL, its admin URL or None)."""
    port = free_port()
    if cfg.kind == "grid":
        admin = free_port()
        queue = '{ metric: "llamacpp:requests_deferred"' + (
            ", count_in_flight: true }" if cfg.count_in_flight else " }")
        affinity = []
        if cfg.priced:
            affinity.append(f"prefill_tokens_per_second: {args.prefill_rate:.0f}")
        if cfg.learned:
            prior = args.prefill_rate if args.prefill_rate else LEARNED_PRIOR_FALLBACK
            affinity += ["prefill_tokens_per_second: auto",
                         f"prefill_prior_tokens_per_second: {prior:.0f}", "engine_feedback: true"]
        if cfg.no_feedback:
            affinity.append("engine_feedback: false")
        if cfg.threshold is not None:
            affinity.append(f"threshold: {cfg.threshold}")
        if cfg.queued_seconds is not None:
            affinity.append(f"queued_request_seconds: {cfg.queued_seconds}")
        if cfg.queued_measured:
            affinity.append(f"queued_request_seconds: {args.request_seconds:.0f}")
        yaml = f"listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\n"
        if not cfg.defaults:
            # Every other grid-* config names the queue metric as the README did before the
            # defaults found it.
            yaml += f"queue: {queue}\n"
        if affinity:
            yaml += "grid_site_route: { prefix_affinity: { " + ", ".join(affinity) + " } }\n"
        yaml += "sites:\n"
        for k, url in enumerate(engines):
            yaml += (f"  - {{ name: s{k}, clusters: [{{ name: s{k}-a, models: [{MODEL}], "
                     f"endpoints: [{url}] }}] }}\n")
        (out / "gateway.yaml").write_text(yaml)
        gateway = args.old_gateway if cfg.old else args.gateway
        if not gateway:
            sys.exit(f"arena: {cfg.name} needs --old-gateway PATH (a release build of another commit)")
        procs.start("gateway", [gateway, "serve", "--config", str(out / "gateway.yaml")])
        wait_ready(procs, [f"http://127.0.0.1:{admin}/healthz"], "gateway")
        # Let the gateway read every engine's queue once before the first request.
        time.sleep(1.5)
        return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    if cfg.kind in ("sglang", "vllm"):
        binary = str(Path(sys.executable).parent / f"{cfg.kind}-router")
        # sglang-router takes a `launch` subcommand for a router alone; vllm-router has none.
        launch = ["launch"] if cfg.kind == "sglang" else []
        procs.start(cfg.kind, [
            binary, *launch, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--policy", cfg.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        ])
        base = f"http://127.0.0.1:{port}"
        wait_ready(procs, [f"{base}/health", f"{base}/v1/models"], cfg.kind)
        return base, None
    return engines[0], None


# ---------------------------------------------------------------------------------------
# Replay.


@dataclass
class Turn:
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    # Which conversation and turn, and when it was sent (Unix seconds): lets a reader line
    # the turns up with the gateway's access log. Runs recorded before these existed lack them.
    conversation: str = ""
    turn: int = 0
    sent_at: float = 0.0


@dataclass
class RunResult:
    router: str
    repeat: int
    wall: float
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)
    sockets: int = 0
    # The router's settings as run (a later invocation may calibrate other figures).
    label: str = ""
    # grid-route's learned prices at the end of the run, per cluster: (prefill tokens a
    # second, seconds a queued request), from its gauges.
    prices: dict[str, list[float]] = field(default_factory=dict)

    @property
    def cached_share(self) -> float:
        prompt = sum(t.prompt_tokens for t in self.turns)
        return sum(t.cached_tokens for t in self.turns) / prompt if prompt else 0.0


def request_id(conversation: str, turn: int) -> str:
    """The `x-request-id` a turn is sent with: its conversation and turn."""
    return f"{conversation}-{turn}"


def replay(base: str, conv: Conversation, args, result: RunResult, lock: threading.Lock,
           session: bool = False) -> None:
    import openai

    # The conversation's id as its prompt_cache_key, as coding agents send it.
    session_fields = {"prompt_cache_key": conv.id} if session else {}
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="arena", max_retries=0, timeout=900)
    messages = [{"role": "system", "content": conv.system}] if conv.system else []
    for index, (question, answer) in enumerate(conv.turns):
        messages.append({"role": "user", "content": question})
        sent_at = time.time()
        t0 = time.perf_counter()
        first_chunk = first_token = None
        usage = timings = None
        try:
            # The turn's own request id, which grid-route's request log prints, so that
            # arena_turns.py finds each turn's decision by id rather than by time.
            stream = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=args.max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True}, **session_fields,
                extra_headers={"x-request-id": request_id(conv.id, index)},
            )
            for chunk in stream:
                now = time.perf_counter()
                first_chunk = first_chunk or now
                if first_token is None and chunk.choices and chunk.choices[0].delta.content:
                    first_token = now
                if chunk.usage is not None:
                    usage = chunk.usage
                extra = chunk.model_extra or {}
                timings = extra.get("timings", timings)
        except openai.OpenAIError as e:
            with lock:
                result.errors.append(f"{conv.id}: {type(e).__name__}: {str(e)[:200]}")
            return
        cached = None
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens
        if cached is None and timings:
            cached = timings.get("cache_n")
        if usage is None or cached is None:
            with lock:
                result.errors.append(f"{conv.id}: no usage with cached tokens in the answer")
            return
        with lock:
            result.turns.append(Turn(
                (first_token or first_chunk or t0) - t0, usage.prompt_tokens, cached, conv.id, index, sent_at))
        messages.append({"role": "assistant", "content": answer})


# Per-cluster counters a run's decisions sum over every cluster, by the name they are listed as.
SUMMED_COUNTERS = {
    # Index entries engine feedback forgot.
    "grid_route_index_forgotten_total": "forgotten",
    # First turns that joined a busier holder of their system prompt (also sticky).
    "grid_route_shared_head_joins_total": "joined",
    # Clusters left out because a slot there had just gone idle.
    "grid_route_slot_passed_over_total": "passed_over",
    # New conversations Select held for a live turn where a slot had just gone idle.
    "grid_route_slot_holds_total": "held",
    # Requests Select sent a moment after the prompt before them, a pass apart.
    "grid_route_pass_spacings_total": "spaced",
}


def scrape_decisions(admin: str) -> dict[str, float]:
    """grid-route's affinity outcomes, and the counters of `SUMMED_COUNTERS`, from its metrics."""
    status, body = http_get(f"{admin}/metrics")
    counts: dict[str, float] = {}
    if status != 200:
        return counts
    for line in body.splitlines():
        name, _, rest = line.partition("{")
        if not rest:
            continue
        labels, value = line.rsplit(" ", 1)
        if name == "grid_route_prefix_affinity_total":
            key = labels.split('outcome="', 1)[1].split('"', 1)[0]
        elif name in SUMMED_COUNTERS:
            key = SUMMED_COUNTERS[name]
        else:
            continue
        counts[key] = counts.get(key, 0) + float(value)
    return counts


def scrape_prices(admin: str) -> dict[str, list[float]]:
    """grid-route's two learned prices per cluster, from its gauges."""
    status, body = http_get(f"{admin}/metrics")
    prices: dict[str, list[float]] = {}
    if status != 200:
        return prices
    for line in body.splitlines():
        for i, name in enumerate(["grid_route_prefill_tokens_per_second{",
                                  "grid_route_queued_request_seconds{"]):
            if line.startswith(name):
                labels, value = line.rsplit(" ", 1)
                cluster = labels.split('cluster="', 1)[1].split('"', 1)[0]
                prices.setdefault(cluster, [0.0, 0.0])[i] = float(value)
    return prices


def run_once(cfg: RouterConfig, repeat: int, conversations, args) -> RunResult:
    out = args.out / f"{cfg.name}-{repeat}"
    out.mkdir(parents=True, exist_ok=True)
    procs = Procs(out)
    try:
        engines = start_engines(procs, args)
        base, admin = start_router(procs, cfg, engines, args, out)
        result = RunResult(cfg.name, repeat, 0.0)
        lock = threading.Lock()
        with NetworkWatch([os.getpid(), *procs.pids()]) as watch:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                futures = [pool.submit(replay, base, c, args, result, lock, cfg.prompt_cache_key)
                           for c in conversations]
                for future in futures:
                    future.result()
            result.wall = time.perf_counter() - t0
        if admin:
            result.decisions = scrape_decisions(admin)
            result.prices = scrape_prices(admin)
        procs.check_alive()
    finally:
        procs.stop()
    result.sockets = len(watch.sockets_seen)
    if watch.violations:
        raise RuntimeError(f"non-loopback network use in {cfg.name}: {sorted(set(watch.violations))}")
    return result


def calibrate(conversations, systems, args) -> tuple[float, float]:
    """This CPU's prefill rate and request time: one fresh engine, one ~1k-token uncached
    prompt answered with `--max-tokens` tokens; the engine's own
    `timings.prompt_per_second`, and its `prompt_ms + predicted_ms` (how long one request
    holds a slot, alone on the engine)."""
    out = args.out / "calibrate"
    out.mkdir(parents=True, exist_ok=True)
    procs = Procs(out)
    try:
        (url,) = start_engines(procs, args, n=1)
        body = json.dumps({
            "model": MODEL, "max_tokens": args.max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": systems[0]}, {"role": "user", "content": "Hello"}],
        }).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.load(r)
        timings = answer["timings"]
        held = (float(timings["prompt_ms"]) + float(timings["predicted_ms"])) / 1000
        return float(timings["prompt_per_second"]), held
    finally:
        procs.stop()


# ---------------------------------------------------------------------------------------
# The run as a trace, for `simulate` (docs/routing.md, "Calibrating the slot engine against the arena").

# simulate --block-tokens 64: finer than Mooncake's 512, as the arena's prompts are short.
TRACE_BLOCK_TOKENS = 64


def prompt_text(conv: Conversation, turn: int) -> str:
    """The text of turn `turn`'s messages, in order: what two turns of a conversation
    share is a prefix of it."""
    parts = [conv.system] if conv.system else []
    for question, answer in conv.turns[:turn]:
        parts += [question, answer]
    parts.append(conv.turns[turn][0])
    return "\n".join(parts)


def write_trace(run_dir: Path, conversations: list[Conversation], result: "RunResult", args) -> Path:
    """Writes what a run sent as a Mooncake-format trace (`simulate --trace`): each turn
    at its send time, its prompt tokens as the engine counted them, `--max-tokens` out, and
    one id per 64-token block (`simulate --block-tokens 64`) standing for the prompt up to the end of that block. Blocks
    are cut by characters at the run's characters-a-token ratio (one ratio for every turn),
    so two prompts share a block id exactly when they share its text; a turn that repeats
    an earlier prefix repeats its ids. Each line names its conversation (simulate's
    `conversation` field, numbered in the order the conversations were sent): cut by an
    average ratio, a turn's last full block need not be the next turn's, and derived from
    the blocks alone about 25 of the 60 later turns would start conversations of their own."""
    by_id = {c.id: c for c in conversations}
    numbers: dict[str, int] = {}
    ids: dict[str, int] = {}
    start = min(t.sent_at for t in result.turns)
    texts = {(t.conversation, t.turn): prompt_text(by_id[t.conversation], t.turn) for t in result.turns}
    per_token = sum(map(len, texts.values())) / max(1, sum(t.prompt_tokens for t in result.turns))
    lines = []
    for t in sorted(result.turns, key=lambda t: t.sent_at):
        text = texts[(t.conversation, t.turn)]
        blocks = []
        for k in range(math.ceil(t.prompt_tokens / TRACE_BLOCK_TOKENS)):
            end = round((k + 1) * TRACE_BLOCK_TOKENS * per_token)
            # Past the text's end (a turn with more tokens a character than the run's
            # ratio), the block stands for the whole prompt and its position in it.
            key = text[:end] if end < len(text) else (text, k)
            blocks.append(ids.setdefault(key, len(ids)))
        lines.append(json.dumps({
            "timestamp": round(1000 * (t.sent_at - start)), "input_length": t.prompt_tokens,
            "output_length": args.max_tokens, "hash_ids": blocks,
            "conversation": numbers.setdefault(t.conversation, len(numbers)),
        }))
    path = run_dir / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def engine_speeds(run_dir: Path) -> tuple[float, float]:
    """The engines' median prefill and decode speeds over a run, tokens a second per slot,
    from llama-server's own `print_timing` lines (prompt eval and eval)."""
    prefill, decode = [], []
    for log_file in sorted(run_dir.glob("engine*.log")):
        for line in log_file.read_text(errors="replace").splitlines():
            if "tokens per second" not in line:
                continue
            rate = float(line.rsplit("ms per token,", 1)[1].split("tokens per second")[0])
            (prefill if "prompt eval time" in line else decode).append(rate)
    median = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
    return median(prefill), median(decode)


# The simulated policy of each arena router.
SIMULATED_POLICY = {"grid-defaults": "grid-route", "grid-defaults-pck": "grid-route",
                    "vllm-cache_aware": "cache-aware",
                    "sglang-cache_aware": "cache-aware", "grid-defaults-t0.3": "grid-route",
                    "grid-defaults-nofeedback": "grid-route"}


def calibrate_simulator(args, conversations: list[Conversation]) -> None:
    """Every run of OUT whose router `simulate` models, replayed as its own trace: 3 sites
    of one slot engine each (`--slots`), no prefill overhead, at the run's median engine
    speeds times a factor each, and a host prompt cache of `--cache-ram` (at SmolLM2-135M's
    23 KiB a token) plus what else the engine turns out to keep. The factors and the extra
    cache are fitted on the grid-route runs (the triple, from a grid, that brings simulated
    cached share and TTFT p50 and p99 closest to the arena's, in log ratio) and the same
    triple is used for every run, so the peers' rows test the fit."""
    runs = [json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines()]
    cache_ram_tokens = args.cache_ram * 1024 * 1024 // (23 * 1024)
    replays = []
    for run in runs:
        policy = SIMULATED_POLICY.get(run["router"])
        if policy is None:
            continue
        name = f"{run['router']}-{run['repeat']}"
        result = RunResult(run["router"], run["repeat"], run["wall"], [Turn(**t) for t in run["turns"]])
        trace = write_trace(args.out / name, conversations, result, args)
        replays.append((name, policy, result, trace, engine_speeds(args.out / name)))
    # The runs the fit is made on: grid-route at its defaults (grid-defaults-N).
    fitted = [r for r in replays if r[0].startswith("grid-defaults-")
              and r[0].rsplit("-", 1)[1].isdigit() and r[0].count("-") == 2]

    # The simulated flags of each router beyond its policy.
    flags = {"grid-defaults-t0.3": ["--threshold", "0.3"], "grid-defaults-pck": ["--sessions"],
             "grid-defaults-nofeedback": ["--engine-feedback", "false"]}

    def simulated(trace: Path, policy: str, prefill: float, decode: float, extra: int,
                  more: tuple[str, ...] = (), simulator: str | None = None) -> dict:
        router = trace.parent.name.rsplit("-", 1)[0]
        command = [simulator or args.calibrate, "--trace", str(trace), "--block-tokens", str(TRACE_BLOCK_TOKENS),
                   "--sites", str(ENGINES), "--engine", "slots", "--slots", str(args.slots),
                   "--host-cache-tokens", str(cache_ram_tokens + extra), "--prefill-tps", f"{prefill:.2f}",
                   "--decode-tps", f"{decode:.3f}", "--prefill-overhead-ms", "0", "--policies", policy, "--json",
                   *(["--one-prefill-at-a-time"] if args.one_prefill_at_a_time else []),
                   *(["--answers-cached", "true"] if args.answers_cached else []),
                   *(["--llama-cpp-host-cache"] if args.llama_cpp_host_cache else []),
                   *([] if args.open_loop else ["--closed-loop", str(args.concurrency)]),
                   *flags.get(router, []), *more]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return json.loads(out)["results"][0]

    def misfit(sim: dict, result: RunResult) -> float:
        """How far a replay lands from its run: the summed absolute log ratio of cached share
        and TTFT p50 and p99."""
        ttfts = [t.ttft for t in result.turns]
        return sum(abs(math.log(max(s, 1e-9) / max(a, 1e-9))) for s, a in (
            (sim["ttft_p50_s"], pct(ttfts, 50)), (sim["ttft_p99_s"], pct(ttfts, 99)),
            (sim["hit_share"], result.cached_share)))

    factors = [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0]
    extras = [0, 2048, 4096, 8192]
    best = (float("inf"), 1.0, 1.0, 0)
    for fp in factors:
        for fd in factors:
            for extra in extras:
                error = 0.0
                for name, policy, result, trace, (prefill, decode) in fitted:
                    sim = simulated(trace, policy, prefill * fp, decode * fd, extra)
                    error += misfit(sim, result)
                best = min(best, (error, fp, fd, extra))
    error, fp, fd, extra = best
    if args.one_prefill_at_a_time:
        print("Slots share one prefill line (`--one-prefill-at-a-time`).")
    if args.answers_cached:
        print("Engines hold each turn's answer for the next (`--answers-cached true`).")
    if args.llama_cpp_host_cache:
        print("Slots use the host cache as llama.cpp's server does (`--llama-cpp-host-cache`).")
    if args.open_loop:
        print("Each turn sent at its time in the run (open-loop).")
    else:
        print(f"Closed-loop, as the arena's {args.concurrency} clients send (`--closed-loop {args.concurrency}`).")
    print(f"Engine speeds: each run's median from its engines' logs, times {fp} (prefill) and {fd} (decode);")
    print(f"host cache: {cache_ram_tokens} tokens of --cache-ram plus {extra} the engines keep besides their slots.")
    print(f"The three fit the grid-route runs best (absolute log ratio summed over cached share and "
          f"TTFT p50 and p99, {error / max(len(fitted), 1):.2f} a run).\n")
    print("| arena run | policy simulated | engine speeds (prefill / decode tok/s) "
          "| cached share, arena / simulate | TTFT p50, arena / simulate | TTFT p99, arena / simulate "
          "| simulated cached share, `--misses-by-load` |")
    print("|---|---|---|---|---|---|---|")
    peers_misfit, peer_runs = 0.0, 0
    for name, policy, result, trace, (prefill, decode) in replays:
        sim = simulated(trace, policy, prefill * fp, decode * fd, extra)
        ttfts = [t.ttft for t in result.turns]
        if policy != "grid-route":
            peers_misfit += misfit(sim, result)
            peer_runs += 1
        # grid-route under the rule before the free-slot one: what the simulator expects it to gain.
        before = "—"
        if policy == "grid-route":
            old = simulated(trace, policy, prefill * fp, decode * fd, extra, ("--misses-by-load",))
            before = f"{100 * old['hit_share']:.1f}%"
        print(f"| {name} | {policy} | {prefill * fp:.0f} / {decode * fd:.1f} "
              f"| {100 * result.cached_share:.1f}% / {100 * sim['hit_share']:.1f}% "
              f"| {pct(ttfts, 50):.1f} / {sim['ttft_p50_s']:.1f} s | {pct(ttfts, 99):.1f} / {sim['ttft_p99_s']:.1f} s "
              f"| {before} |")
    print(f"\nThe peers' runs land at {peers_misfit / max(peer_runs, 1):.2f} a run by the same measure.")
    if args.compare_simulator:
        # Another build of the simulator (a measurement build of a rule) on grid-route's
        # runs at the same fitted speeds: what it expects the rule to change.
        print(f"\ngrid-route's runs replayed by {args.compare_simulator} at the same speeds and cache:\n")
        print("| arena run | cached share, arena / this simulator / the other "
              "| TTFT p50, this / the other | TTFT p90, this / the other | TTFT p99, this / the other |")
        print("|---|---|---|---|---|")
        for name, policy, result, trace, (prefill, decode) in replays:
            if policy != "grid-route":
                continue
            this = simulated(trace, policy, prefill * fp, decode * fd, extra)
            other = simulated(trace, policy, prefill * fp, decode * fd, extra,
                              simulator=args.compare_simulator)
            cells = " | ".join(f"{this[k]:.2f} / {other[k]:.2f} s"
                               for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"))
            print(f"| {name} | {100 * result.cached_share:.1f}% / {100 * this['hit_share']:.1f}% / "
                  f"{100 * other['hit_share']:.1f}% | {cells} |")


# ---------------------------------------------------------------------------------------
# Report.


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] if ordered else float("nan")


def table(results: list[RunResult], configs: dict[str, RouterConfig], order: list[str]) -> str:
    rows = [
        "| router (policy) | cached share | TTFT p50 / p90 / p99 | TTFT p99 per run | wall | affinity decisions |",
        "|---|---|---|---|---|---|",
    ]
    for name in order:
        runs = [r for r in results if r.router == name]
        if not runs:
            continue
        ttfts = [t.ttft for r in runs for t in r.turns]
        shares = ", ".join(f"{100 * r.cached_share:.1f}%" for r in runs)
        p99s = ", ".join(f"{pct([t.ttft for t in r.turns], 99):.1f}" for r in runs)
        walls = [r.wall for r in runs]
        wall = f"{min(walls):.0f}–{max(walls):.0f} s" if len(walls) > 1 else f"{walls[0]:.0f} s"
        decisions = "; ".join(
            ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.decisions.items()) if v) for r in runs if r.decisions)
        errors = sum(len(r.errors) for r in runs)
        # The labels its runs were made with (runs recorded before labels were, take today's).
        labels = list(dict.fromkeys(r.label or configs[name].label for r in runs))
        label = " / ".join(labels) + (f" **{errors} failed**" if errors else "")
        rows.append(
            f"| {label} | {shares} | {pct(ttfts, 50):.1f} / {pct(ttfts, 90):.1f} / {pct(ttfts, 99):.1f} s "
            f"| {p99s} s | {wall} | {decisions or '—'} |")
    # Cached share by turn of the conversation, pooled over each router's runs.
    turns = sorted({t.turn for r in results for t in r.turns})
    rows += ["", "| router (policy) | " + " | ".join(f"turn {k + 1}" for k in turns) + " |",
             "|---|" + "---|" * len(turns)]
    for name in order:
        runs = [r for r in results if r.router == name]
        if not runs:
            continue
        cells = []
        for k in turns:
            at = [t for r in runs for t in r.turns if t.turn == k]
            prompt = sum(t.prompt_tokens for t in at)
            cells.append(f"{100 * sum(t.cached_tokens for t in at) / prompt:.1f}%" if prompt else "—")
        label = " / ".join(dict.fromkeys(r.label or configs[name].label for r in runs))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    sys.addaudithook(_audit)
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    parser.add_argument("--routers", default="grid-defaults,vllm-cache_aware,sglang-cache_aware",
                        help="comma-separated, run in this order")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each router, interleaved")
    parser.add_argument("--conversations", type=int, default=20, help="conversations replayed")
    parser.add_argument("--shared", type=int, default=10, help="conversations behind the shared system prompts")
    parser.add_argument("--max-turns", type=int, default=5, help="turns kept of each conversation")
    parser.add_argument("--concurrency", type=int, default=6, help="conversations at a time")
    parser.add_argument("--message-chars", type=int, default=800, help="each message cut to this")
    parser.add_argument("--system-chars", type=int, default=4000, help="length of each shared system prompt")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every turn")
    parser.add_argument("--slots", type=int, default=2, help="llama-server --parallel")
    parser.add_argument("--ctx-size", type=int, default=8192, help="llama-server --ctx-size")
    parser.add_argument("--cache-ram", type=int, default=0,
                        help="llama-server --cache-ram, MiB of host prompt cache (0: none; -cram 8192 is "
                        "the second regime)")
    parser.add_argument("--seed", type=int, default=14, help="shuffles the conversations' order")
    parser.add_argument("--prefill-rate", type=float, default=None,
                        help="tok/s for the priced grid-route runs; default: measured on a fresh engine")
    parser.add_argument("--request-seconds", type=float, default=None,
                        help="queued_request_seconds of grid-recommended: how long one request holds "
                        "an engine slot; default: measured on a fresh engine with the prefill rate")
    parser.add_argument("--calibrate", metavar="SIMULATOR", default=None,
                        help="run nothing: replay every grid-route defaults, vllm-router and sglang-router "
                        "cache_aware run of OUT through SIMULATOR (the grid-route-simulate binary) as its "
                        "trace, on slot engines at the run's own engine speeds, and print arena against "
                        "simulate")
    parser.add_argument("--one-prefill-at-a-time", action="store_true",
                        help="with --calibrate: simulate engines whose slots share one prefill line "
                        "(grid-route-simulate --one-prefill-at-a-time), the logged prefill speed "
                        "being the engine's")
    parser.add_argument("--answers-cached", action="store_true",
                        help="with --calibrate: simulate engines that hold each turn's answer for the "
                        "next (grid-route-simulate --answers-cached true)")
    parser.add_argument("--llama-cpp-host-cache", action="store_true",
                        help="with --calibrate: simulate slots that use the host cache as llama.cpp's "
                        "server does (grid-route-simulate --llama-cpp-host-cache)")
    parser.add_argument("--compare-simulator", metavar="SIMULATOR", default=None,
                        help="with --calibrate: also replay grid-route's runs through this other "
                        "grid-route-simulate build (say one with a rule switched off) at the fitted "
                        "speeds, and print both")
    parser.add_argument("--open-loop", action="store_true",
                        help="with --calibrate: send each turn at its time in the run, whatever the "
                        "simulated engines did before, instead of closed-loop as the arena's clients "
                        "(grid-route-simulate --closed-loop CONCURRENCY)")
    parser.add_argument("--trace-of", metavar="RUN", default=None,
                        help="run nothing: write OUT/RUN/trace.jsonl, what run RUN (say grid-defaults-1) "
                        "of OUT sent, for simulate, and print the engines' speeds in it")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--llama-model", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--old-gateway", default=None,
                        help="the grid-route-example binary of another commit, for grid-recommended-old "
                             "(say, one built with `cargo build --release` in a worktree of it)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trace_of or args.calibrate:
        # The workload of the runs in OUT, whatever the command line says.
        for key, value in json.loads((args.out / "workload.json").read_text()).items():
            setattr(args, key, value)

    configs = router_configs(None, None)
    order = [name.strip() for name in args.routers.split(",") if name.strip()]
    requested = set(order)
    unknown = [name for name in order if name not in configs]
    if unknown:
        sys.exit(f"arena: unknown routers {unknown}; known: {', '.join(configs)}")
    old = [name for name in order if configs[name].old]
    if old and not args.old_gateway:
        sys.exit(f"arena: {', '.join(old)} needs --old-gateway PATH (a release build of another commit)")

    records, cut = recover_records(Path(args.dataset))
    log(f"dataset: recovered {len(records)} complete records"
        + (" (the file is cut off after them)" if cut else " (the file is whole)"))
    conversations, systems = build_workload(records, args)
    if args.calibrate:
        calibrate_simulator(args, conversations)
        return
    if args.trace_of:
        results_file = args.out / "results.jsonl"
        runs = [json.loads(line) for line in results_file.read_text().splitlines()]
        run = next((d for d in runs if f"{d['router']}-{d['repeat']}" == args.trace_of), None)
        if run is None:
            sys.exit(f"arena: no run {args.trace_of} in {results_file}")
        result = RunResult(run["router"], run["repeat"], run["wall"], [Turn(**t) for t in run["turns"]])
        path = write_trace(args.out / args.trace_of, conversations, result, args)
        prefill, decode = engine_speeds(args.out / args.trace_of)
        print(json.dumps({"trace": str(path), "turns": len(result.turns),
                          "prefill_tokens_per_second": prefill, "decode_tokens_per_second": decode}))
        return
    turns = sum(len(c.turns) for c in conversations)
    log(f"workload: {len(conversations)} conversations, {turns} turns, {args.shared} behind 3 shared "
        f"system prompts of {args.system_chars} chars, {args.concurrency} at a time")

    needs_rate = any(configs[n].priced or configs[n].learned for n in requested) and args.prefill_rate is None
    needs_time = any(configs[n].queued_measured for n in requested) and args.request_seconds is None
    if needs_rate or needs_time:
        rate, held = calibrate(conversations, systems, args)
        if args.prefill_rate is None:
            args.prefill_rate = rate
        if args.request_seconds is None:
            args.request_seconds = held
        log(f"one engine on this CPU: prefill {rate:.0f} tok/s, one ~1k-token request held "
            f"its slot {held:.1f} s")
    configs = router_configs(args.prefill_rate, args.request_seconds)

    # Runs already in OUT (an earlier invocation with the same workload) join the table, so
    # that a session can be run in parts; a different workload in OUT is refused.
    shape = {k: getattr(args, k) for k in (
        "conversations", "shared", "max_turns", "concurrency", "message_chars", "system_chars",
        "max_tokens", "slots", "ctx_size", "seed", "cache_ram")}
    shape_file = args.out / "workload.json"
    if shape_file.exists() and json.loads(shape_file.read_text()) != shape:
        sys.exit(f"arena: {args.out} holds runs of another workload ({shape_file}); use another OUT")
    shape_file.write_text(json.dumps(shape) + "\n")
    results: list[RunResult] = []
    results_file = args.out / "results.jsonl"
    if results_file.exists():
        for line in results_file.read_text().splitlines():
            d = json.loads(line)
            earlier = RunResult(d["router"], d["repeat"], d["wall"], [Turn(**t) for t in d["turns"]],
                                d["errors"], d["decisions"], d["sockets"], d.get("label", ""),
                                d.get("prices", {}))
            results.append(earlier)
            if earlier.router not in order:
                order.append(earlier.router)
    for _ in range(args.repeats):
        for name in list(order):
            if name not in requested:
                continue
            repeat = 1 + sum(r.router == name for r in results)
            result = run_once(configs[name], repeat, conversations, args)
            result.label = configs[name].label
            results.append(result)
            ttfts = [t.ttft for t in result.turns]
            log(f"{name} #{repeat}: cached {100 * result.cached_share:.1f}%, TTFT p50/p90/p99 "
                f"{pct(ttfts, 50):.1f}/{pct(ttfts, 90):.1f}/{pct(ttfts, 99):.1f} s, wall {result.wall:.0f} s, "
                f"{len(result.turns)} turns, {len(result.errors)} errors, {result.sockets} sockets all loopback"
                + (f", decisions {result.decisions}" if result.decisions else "")
                + (", learned prices " + ", ".join(f"{c} {p:.0f} tok/s {q:.2f} s" for c, (p, q)
                                                   in sorted(result.prices.items()))
                   if result.prices else ""))
            for error in result.errors[:3]:
                log(f"  error: {error}")
            with open(args.out / "results.jsonl", "a") as f:
                f.write(json.dumps({
                    "router": name, "repeat": repeat, "wall": result.wall,
                    "cached_share": result.cached_share, "errors": result.errors,
                    "decisions": result.decisions, "sockets": result.sockets, "label": result.label,
                    "prices": result.prices,
                    "turns": [t.__dict__ for t in result.turns],
                }) + "\n")
            (args.out / "table.md").write_text(table(results, configs, order) + "\n")
    print(table(results, configs, order))


if __name__ == "__main__":
    main()
