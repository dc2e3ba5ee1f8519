"""The gateway under steady load and a chaos schedule, with figures (scripts/soak runs it).

`serve` runs in front of five `mock-engine` processes, one cluster per site (alpha .. echo),
with the shared index on a Redis of its own. Client threads send chat, streamed chat,
Responses chains through the gateway's tagged ids, and Anthropic messages (plain and
streamed), one request after another, for the whole run; two more are slow clients, one
dribbling its request body, one reading its streamed answer a few bytes at a time. Meanwhile:

- SIGHUP every 5 s (the config file is rewritten first, so every reload is a real one);
- alpha's engine is killed (SIGKILL) and restarted on its port;
- bravo's engine wedges: it takes requests and answers none, its /metrics still empty;
- charlie's engine answers 429s with a Retry-After, then 500s;
- the shared index's Redis is stopped and started again.

Every request is classified (see `classify`); the run fails (exit 1) when any request failed
that another cluster could have served, when a pinned follow-up was answered by another
cluster, when the gateway published no shared-index event after Redis came back, or when
the gateway does not exit 0 on SIGTERM. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

MODEL = "soak-model"
SITES = ["alpha", "bravo", "charlie", "delta", "echo"]
KILLED, WEDGED, FAILING = "alpha", "bravo", "charlie"
# How long a client waits for a whole answer before it gives up and drops the connection.
PATIENCE_S = 20.0
RELOAD_EVERY_S = 5.0
SYSTEM_PROMPTS = [
    ("You are a support agent for a telescope shop. " * 40),
    ("You translate between English and French, tersely. " * 40),
    ("You are a code reviewer who cares about error handling. " * 40),
]


# Every process the soak starts, killed on the way out however the run ends.
CHILDREN: list[subprocess.Popen] = []


def spawn(command: list[str], log) -> subprocess.Popen:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    CHILDREN.append(process)
    return process


def say(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(what: str, check, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise SystemExit(f"soak: timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def http_ok(port: int, path: str) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def post(port: int, path: str, body: dict, timeout: float = 5) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    return answer.status, data


# ---- the processes ---------------------------------------------------------------------


class Engine:
    def __init__(self, binary: str, site: str, workdir: str):
        self.binary, self.site, self.port = binary, site, free_port()
        self.log = open(os.path.join(workdir, f"engine-{site}.log"), "ab")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = spawn(
            [self.binary, "mock-engine", "--listen", f"127.0.0.1:{self.port}",
             "--name", self.site, "--model", MODEL, "--max-running", "8",
             "--prefill-tokens-per-second", "400000", "--decode-ms-per-token", "1"],
            self.log)
        wait_until(f"engine {self.site}", lambda: http_ok(self.port, "/metrics"), 20)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def admin(self, path: str, body: dict) -> None:
        status, data = post(self.port, path, body)
        if status != 200:
            raise SystemExit(f"soak: {self.site} {path} answered {status}: {data[:200]!r}")


class Redis:
    def __init__(self, workdir: str):
        self.port, self.workdir = free_port(), workdir
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = spawn(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir],
            subprocess.DEVNULL)

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_until("redis-server", answers, 20)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()


def config_yaml(port: int, admin_port: int, redis_port: int, key_path: str,
                engines: list[Engine], generation: int) -> str:
    lines = [
        f"listen: 127.0.0.1:{port}",
        f"admin_listen: 127.0.0.1:{admin_port}",
        "grid_site_route:",
        "  prefix_affinity:",
        f"    tag_key_path: {key_path}",
        "    shared_index:",
        f"      redis_url: redis://127.0.0.1:{redis_port}/0",
        "      key_prefix: soak",
        "sites:",
    ]
    for engine in engines:
        lines.append(f"  - {{ name: {engine.site}, clusters: [{{ name: {engine.site}-1, "
                     f"models: [{MODEL}], endpoints: [http://127.0.0.1:{engine.port}] }}] }}")
    # A comment that changes with every reload, so the file always differs.
    lines.append(f"# reload {generation}")
    return "\n".join(lines) + "\n"


def proc_figures(pid: int) -> tuple[int, int]:
    """The process's resident memory in KiB and its open file descriptors."""
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


PUBLISHED = 'grid_route_shared_index_events_total{direction="published"}'


def series_sum(metrics: str, prefix: str) -> float:
    """The sum of the samples of every series whose line starts with `prefix`."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(prefix))


def published(admin_port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return series_sum(text, PUBLISHED)


# ---- the load --------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    started: float
    ended: float
    status: int | None = None  # None: no answer (refused, reset, cut, or the client gave up)
    error: str = ""
    code: str = ""  # the error answer's `code`, when it is an OpenAI-style one
    engine: str | None = None
    gave_up: bool = False
    pinned_to: str | None = None  # the engine a follow-up must reach
    complete: bool = True  # a stream that ended with its closing event


@dataclass
class Stats:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def read_stream(answer: http.client.HTTPResponse, slow: bool) -> tuple[bytes, bool]:
    chunks = []
    while True:
        chunk = answer.read1(16 if slow else 65536)
        if not chunk:
            break
        chunks.append(chunk)
        if slow:
            time.sleep(0.05)
    data = b"".join(chunks)
    return data, b"[DONE]" in data or b"message_stop" in data


def gateway_error(data: bytes) -> tuple[str, str]:
    """The message and code of an OpenAI-style error answer (`{"error": {"message": ...,
    "code": ...}}`), or the start of the body and no code when it is not one."""
    try:
        error = json.loads(data)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace"), ""
    code = error.get("code") if isinstance(error, dict) else None
    return str(message)[:200], str(code or "")


def send(port: int, kind: str, path: str, body: dict, *, stream: bool = False,
         slow_body: bool = False, slow_read: bool = False,
         pinned_to: str | None = None) -> tuple[Outcome, dict | None]:
    outcome = Outcome(kind=kind, started=time.monotonic(), ended=0.0, pinned_to=pinned_to)
    payload = json.dumps(body).encode()
    parsed = None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE_S)
    try:
        conn.putrequest("POST", path)
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(payload)))
        conn.endheaders()
        if slow_body:
            # Well under timeouts.client_body_idle_secs between pieces.
            for i in range(0, len(payload), max(1, len(payload) // 8)):
                conn.send(payload[i:i + max(1, len(payload) // 8)])
                time.sleep(0.3)
        else:
            conn.send(payload)
        answer = conn.getresponse()
        outcome.status = answer.status
        outcome.engine = answer.getheader("x-mock-engine")
        if stream and answer.status == 200:
            data, outcome.complete = read_stream(answer, slow_read)
        else:
            data = answer.read()
            if answer.status == 200:
                parsed = json.loads(data)
            else:
                outcome.error, outcome.code = gateway_error(data)
    except socket.timeout:
        outcome.status, outcome.gave_up, outcome.error = None, True, "client gave up"
    except (OSError, http.client.HTTPException, ValueError) as error:
        if outcome.status == 200:
            outcome.complete = False
        else:
            outcome.status = None
        outcome.error = f"{type(error).__name__}: {error}"[:200]
    finally:
        conn.close()
        outcome.ended = time.monotonic()
    return outcome, parsed


def client_loop(port: int, stats: Stats, stop: threading.Event, seed: int,
                slow: str | None) -> None:
    rng = random.Random(seed)
    turn = 0
    while not stop.is_set():
        turn += 1
        system = rng.choice(SYSTEM_PROMPTS)
        user = f"question {seed}-{turn}: {rng.random()}"
        if slow == "body":
            outcome, _ = send(port, "chat (slow body)", "/v1/chat/completions",
                              {"model": MODEL, "max_tokens": 8, "messages": [
                                  {"role": "system", "content": system},
                                  {"role": "user", "content": user}]}, slow_body=True)
            stats.add(outcome)
            continue
        if slow == "read":
            outcome, _ = send(port, "streamed chat (slow reader)", "/v1/chat/completions",
                              {"model": MODEL, "max_tokens": 32, "stream": True, "messages": [
                                  {"role": "system", "content": system},
                                  {"role": "user", "content": user}]},
                              stream=True, slow_read=True)
            stats.add(outcome)
            continue
        pick = rng.random()
        if pick < 0.3:
            outcome, _ = send(port, "chat", "/v1/chat/completions",
                              {"model": MODEL, "max_tokens": 8, "messages": [
                                  {"role": "system", "content": system},
                                  {"role": "user", "content": user}]})
            stats.add(outcome)
        elif pick < 0.55:
            outcome, _ = send(port, "streamed chat", "/v1/chat/completions",
                              {"model": MODEL, "max_tokens": 8, "stream": True, "messages": [
                                  {"role": "system", "content": system},
                                  {"role": "user", "content": user}]}, stream=True)
            stats.add(outcome)
        elif pick < 0.8:
            first, answer = send(port, "responses", "/v1/responses",
                                 {"model": MODEL, "max_output_tokens": 8, "input": user})
            stats.add(first)
            if answer is None or first.engine is None:
                continue
            previous = answer.get("id")
            for step in range(2):
                if stop.is_set() or not previous:
                    break
                follow, answer = send(port, "responses follow-up", "/v1/responses",
                                      {"model": MODEL, "max_output_tokens": 8,
                                       "previous_response_id": previous,
                                       "input": f"and then {step}?"},
                                      pinned_to=first.engine)
                stats.add(follow)
                previous = answer.get("id") if answer else None
        else:
            streamed = rng.random() < 0.5
            outcome, _ = send(port, "anthropic messages", "/v1/messages",
                              {"model": MODEL, "max_tokens": 8, "stream": streamed,
                               "system": system,
                               "messages": [{"role": "user", "content": user}]},
                              stream=streamed)
            stats.add(outcome)


# ---- the schedule and the verdict ------------------------------------------------------


@dataclass
class Window:
    what: str
    site: str | None
    start: float
    end: float


def overlaps(outcome: Outcome, window: Window, slack: float = 0.5) -> bool:
    return outcome.started <= window.end + slack and outcome.ended >= window.start - slack


def classify(outcome: Outcome, windows: list[Window]) -> str:
    """One of: ok; engine error passed through (the failing engine's own 500 or 429, which
    the contract never retries once a byte reached an engine); lost with the killed engine
    (in flight at the moment it was killed, written to it as it died, pinned to it while
    it was down, or a follow-up whose stored response died with it); waited on the wedged
    engine (gave up, or 504, on a request in flight while the wedge lasted); misrouted (a
    pinned follow-up answered by another cluster); pinned to its held-out cluster (a
    follow-up whose response is stored on a faulted engine's cluster, answered 503 by the
    gateway once the fault began, while that cluster admits nothing); could have been
    served (anything else: another cluster was there to serve it). CI runs these examples
    (`python3 -m doctest scripts/soak.py`):

    >>> from dataclasses import replace
    >>> charlie_fails = Window("failing", FAILING, start=100.0, end=float("inf"))
    >>> refused = Outcome("responses follow-up", started=101.0, ended=101.01, status=503,
    ...                   code="stored_state_unavailable", pinned_to=FAILING)
    >>> classify(refused, [charlie_fails])
    'pinned to its held-out cluster'
    >>> classify(replace(refused, started=90.0, ended=90.1), [charlie_fails])
    'could have been served'
    >>> classify(replace(refused, pinned_to="delta"), [charlie_fails])
    'could have been served'
    >>> classify(replace(refused, status=200, engine="delta"), [charlie_fails])
    'misrouted follow-up'
    >>> classify(replace(refused, status=500, code="", engine=FAILING), [charlie_fails])
    'engine error passed through'
    """
    if outcome.pinned_to is not None and outcome.engine not in (None, outcome.pinned_to):
        return "misrouted follow-up"
    if outcome.status is not None and 200 <= outcome.status < 300 and outcome.complete:
        return "ok"
    if outcome.engine == FAILING and outcome.status in (500, 429):
        return "engine error passed through"
    for window in windows:
        if window.what != "killed":
            continue
        killed_in_flight = outcome.started <= window.start <= outcome.ended
        pinned_while_down = outcome.pinned_to == window.site and overlaps(outcome, window)
        if killed_in_flight and outcome.engine in (None, window.site):
            return "lost with the killed engine"
        if pinned_while_down and outcome.engine is None:
            return "lost with the killed engine"
        reached_it = (outcome.status == 502 and outcome.engine is None
                      and outcome.error.startswith(f"backend cluster {window.site}/"))
        if reached_it and overlaps(outcome, window):
            # Written to the engine as it died (its connection closed unanswered): the
            # gateway answers 502 naming that cluster only when a byte of the request may
            # have reached it, which it never retries; a connect it could not make goes
            # to the next cluster.
            return "lost with the killed engine"
        if (outcome.pinned_to == window.site and outcome.engine == window.site
                and outcome.status == 404 and outcome.started >= window.end):
            # The restarted engine lost the stored response the follow-up continues.
            return "lost with the killed engine"
    for window in windows:
        # From the fault's start to the end of the run: an ejection can outlast the fault
        # (charlie's third, after its 500s, is 120 s).
        held_out = (outcome.pinned_to == window.site and outcome.engine is None
                    and outcome.status == 503 and outcome.code == "stored_state_unavailable"
                    and outcome.ended >= window.start - 0.5)
        if held_out:
            # The contract's answer for a follow-up whose cluster admits nothing right now
            # (held out by a 429's Retry-After, or ejected): only that cluster holds the
            # response, so no other could have served it.
            return "pinned to its held-out cluster"
    for window in windows:
        if window.what == "wedged" and overlaps(outcome, window) and outcome.engine is None:
            if outcome.gave_up or outcome.status == 504:
                return "waited on the wedged engine"
    return "could have been served"


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="the grid-route-example binary")
    parser.add_argument("--duration", type=float, default=600, help="seconds of load")
    parser.add_argument("--clients", type=int, default=6, help="steady client threads")
    parser.add_argument("--workdir", required=True, help="logs and the config go here")
    args = parser.parse_args()
    if args.duration < 40:
        parser.error("--duration must be at least 40 s, to fit the chaos schedule")
    os.makedirs(args.workdir, exist_ok=True)

    key_path = os.path.join(args.workdir, "tag.key")
    with open(key_path, "wb") as key:
        key.write(secrets.token_bytes(32))
    redis = Redis(args.workdir)
    redis.start()
    engines = [Engine(args.binary, site, args.workdir) for site in SITES]
    for engine in engines:
        engine.start()
    by_site = {engine.site: engine for engine in engines}
    port, admin_port = free_port(), free_port()
    config_path = os.path.join(args.workdir, "gateway.yaml")
    generation = 0

    def write_config() -> None:
        with open(config_path + ".tmp", "w") as config:
            config.write(config_yaml(port, admin_port, redis.port, key_path, engines,
                                     generation))
        os.replace(config_path + ".tmp", config_path)

    write_config()
    gateway_log = open(os.path.join(args.workdir, "gateway.log"), "ab")
    gateway = spawn([args.binary, "serve", "--config", config_path, "--log-format", "json"],
                    gateway_log)
    wait_until("the gateway", lambda: http_ok(admin_port, "/healthz"), 30)
    status, body = post(port, "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    if status != 200:
        raise SystemExit(f"soak: the gateway's first answer was {status}: {body[:200]!r}")
    rss_start, fds_start = proc_figures(gateway.pid)
    say(f"gateway pid {gateway.pid} on 127.0.0.1:{port}; RSS {rss_start} KiB, "
        f"{fds_start} open fds; {args.duration:.0f} s of load from {args.clients} clients "
        f"and 2 slow ones")

    stats, stop = Stats(), threading.Event()
    # Daemons: a run that fails half-way must not wait on its clients to exit.
    threads = [threading.Thread(target=client_loop, args=(port, stats, stop, i, None),
                                daemon=True)
               for i in range(args.clients)]
    threads += [threading.Thread(target=client_loop, args=(port, stats, stop, 100, "body"),
                                 daemon=True),
                threading.Thread(target=client_loop, args=(port, stats, stop, 101, "read"),
                                 daemon=True)]
    started = time.monotonic()
    for thread in threads:
        thread.start()

    d = args.duration
    outage = max(4.0, min(10.0, d * 0.05))
    wedge = max(10.0, min(60.0, d * 0.1))
    # (at, action): the schedule, in seconds from the start of the load.
    schedule = [
        (0.15 * d, "kill"), (0.15 * d + outage, "restart"),
        (0.35 * d, "wedge"), (0.35 * d + wedge, "unwedge"),
        (0.55 * d, "throttle"), (0.65 * d, "fail"),
        (0.70 * d, "redis stop"), (0.70 * d + outage, "redis start"),
    ]
    published_before_stop = None
    windows: list[Window] = []
    open_windows: dict[str, Window] = {}
    next_reload = RELOAD_EVERY_S
    reloads = 0
    while True:
        now = time.monotonic() - started
        if now >= d:
            break
        while schedule and schedule[0][0] <= now:
            _, action = schedule.pop(0)
            at = time.monotonic()
            say(f"t={now:5.1f} s: {action}")
            if action == "kill":
                by_site[KILLED].kill()
                open_windows["killed"] = Window("killed", KILLED, at, float("inf"))
            elif action == "restart":
                by_site[KILLED].start()
                window = open_windows.pop("killed")
                window.end = time.monotonic()
                windows.append(window)
            elif action == "wedge":
                by_site[WEDGED].admin("/mock/stall", {"head_ms": 3_600_000})
                by_site[WEDGED].admin("/mock/queue", {"waiting": 0, "exact": True})
                open_windows["wedged"] = Window("wedged", WEDGED, at, float("inf"))
            elif action == "unwedge":
                # Requests already asleep in the engine stay asleep: the wedge lasts for
                # them until the client gives up.
                by_site[WEDGED].admin("/mock/stall", {"head_ms": 0})
                window = open_windows.pop("wedged")
                window.end = time.monotonic() + PATIENCE_S
                windows.append(window)
            elif action == "throttle":
                by_site[FAILING].admin(
                    "/mock/fail", {"status": 429, "count": 10, "retry_after": 5})
                open_windows["failing"] = Window("failing", FAILING, at, float("inf"))
            elif action == "fail":
                # Replaces what is left of the 429s.
                by_site[FAILING].admin("/mock/fail", {"status": 500, "count": 20})
            elif action == "redis stop":
                redis.stop()
            elif action == "redis start":
                # What was published up to now went out before Redis stopped: counting from
                # here, anything more was published after it came back.
                published_before_stop = published(admin_port)
                redis.start()
        if now >= next_reload:
            generation += 1
            write_config()
            gateway.send_signal(signal.SIGHUP)
            reloads += 1
            next_reload += RELOAD_EVERY_S
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(timeout=PATIENCE_S + 5)
    for window in open_windows.values():
        window.end = time.monotonic()
        windows.append(window)
    load_s = time.monotonic() - started
    time.sleep(1)
    rss_end, fds_end = proc_figures(gateway.pid)

    metrics = ""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        conn.close()
    except OSError as error:
        say(f"cannot read the gateway's /metrics: {error}")
    ejections = series_sum(metrics, "grid_route_ejections_total{")
    published_after = series_sum(metrics, PUBLISHED)
    resumed = (published_before_stop is not None
               and published_after > published_before_stop)
    gateway.send_signal(signal.SIGTERM)
    try:
        exit_code = gateway.wait(timeout=40)
    except subprocess.TimeoutExpired:
        gateway.kill()
        exit_code = "killed after 40 s"
    for engine in engines:
        engine.kill()
    redis.stop()

    outcomes = stats.outcomes
    classes: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        classes.setdefault(classify(outcome, windows), []).append(outcome)
    ok = classes.get("ok", [])
    latencies = [o.ended - o.started for o in ok]
    follow_ups = [o for o in outcomes if o.pinned_to is not None]
    reached = [o for o in follow_ups if o.engine == o.pinned_to and o.status == 200]
    rows = [
        ("load", f"{load_s:.0f} s, {args.clients} clients + 2 slow, {reloads} reloads"),
        ("requests sent", f"{len(outcomes)}"),
        ("answered 2xx, whole", f"{len(ok)}"),
    ]
    for name in ["engine error passed through", "lost with the killed engine",
                 "waited on the wedged engine", "pinned to its held-out cluster",
                 "misrouted follow-up", "could have been served"]:
        rows.append((name, f"{len(classes.get(name, []))}"))
    rows += [
        ("pinned follow-ups answered 2xx by their cluster",
         f"{len(reached)} of {len(follow_ups)}"),
        ("latency of 2xx answers, p50 / p99", f"{percentile(latencies, 50) * 1000:.0f} / "
         f"{percentile(latencies, 99) * 1000:.0f} ms"),
        ("gateway RSS, start → end", f"{rss_start / 1024:.1f} → {rss_end / 1024:.1f} MiB"),
        ("gateway open fds, start → end", f"{fds_start} → {fds_end}"),
        ("endpoints ejected", f"{ejections:.0f}"),
        ("shared-index events published, before Redis came back → at the end",
         f"{published_before_stop or 0:.0f} → {published_after:.0f}"),
        ("exit on SIGTERM", f"{exit_code}"),
    ]
    print("| figure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    failed = classes.get("could have been served", []) + classes.get("misrouted follow-up", [])
    # Before the stall mark every client may have sent one request to the wedged engine,
    # and each ejection's end lets one probe through.
    waited_bound = args.clients + 2 + 2
    waited = len(classes.get("waited on the wedged engine", []))
    for outcome in failed[:20]:
        say(f"FAILED {outcome.kind}: status {outcome.status} engine {outcome.engine} "
            f"pinned {outcome.pinned_to} {outcome.error} "
            f"at {outcome.started - started:.1f}-{outcome.ended - started:.1f} s")
    with open(os.path.join(args.workdir, "outcomes.jsonl"), "w") as out:
        for outcome in outcomes:
            record = dict(outcome.__dict__)
            record["class"] = classify(outcome, windows)
            record["started"] -= started
            record["ended"] -= started
            out.write(json.dumps(record) + "\n")
    if failed or exit_code != 0 or not resumed or waited > waited_bound:
        say(f"failed: {len(failed)} requests another cluster could have served or misrouted; "
            f"{waited} waited on the wedged engine (at most {waited_bound}); "
            f"shared index resumed after Redis came back: {resumed}; exit {exit_code}; "
            f"logs in {args.workdir}")
        return 1
    say(f"passed; logs and every request's outcome in {args.workdir}")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        for child in CHILDREN:
            if child.poll() is None:
                child.kill()
    sys.exit(code)
