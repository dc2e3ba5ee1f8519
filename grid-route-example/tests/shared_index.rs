//! The shared index end to end: two `serve` processes (the binary, fully independent
//! replicas), one real `redis-server` started by the test on a free port, and two mock
//! engines (sites `east` and `west`) in the test process.
//!
//! Affinity must be what keeps a follow-up on its site, so before each follow-up the
//! first turn's site is made one queued request heavier than the other (its 110 KiB
//! prompt is worth more than that): a replica that does not know the prompt routes the
//! follow-up to the other, lighter site; one that learned it through Redis keeps it home.
//!
//! Needs `redis-server` on the PATH (Debian's `redis-server` package; `.ci/run` installs
//! it). Waits poll a condition with a deadline; none guesses a duration.

// Test code: a failed unwrap is a failed test. Metrics are small integers read back
// exactly, so they compare exactly.
#![allow(clippy::unwrap_used, clippy::float_cmp)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use grid_route_example::gateway::shared_index::{EVENT_FIELD, stream_key};
use grid_route_layer::index::wire::WireEvent;
use grid_route_mock_engine::MockEngine;
use grid_route_tests::{
    Conversation, MODEL, PROCESS_WAIT, engine, eventually_within, free_port, metric, other,
    scratch_dir, send, set_queue, site_of, try_send,
};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The first turn's system prompt: worth more than one queued request of prefill.
const SYSTEM_BYTES: usize = 110 * 1024;

// ---- processes ----------------------------------------------------------------------

/// A `redis-server` of the test's own, without persistence, killed on drop.
struct Redis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    async fn start(dir: &Path) -> Self {
        let mut redis = Self {
            port: free_port(),
            dir: dir.to_owned(),
            child: None,
        };
        redis.restart().await;
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server (again, empty) on its port and waits until it answers PING.
    async fn restart(&mut self) {
        let log = std::fs::File::create(self.dir.join("redis.log")).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(log)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server on the PATH (apt-get install redis-server)");
        self.child = Some(child);
        let url = self.url();
        eventually_within("redis-server answers PING", PROCESS_WAIT, || {
            let url = url.clone();
            async move {
                let Ok(mut connection) = connection(&url).await else {
                    return false;
                };
                redis::cmd("PING")
                    .query_async::<String>(&mut connection)
                    .await
                    .is_ok()
            }
        })
        .await;
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }
}

async fn connection(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// A `grid-route-example serve` process, killed on drop.
struct Replica {
    admin: String,
    front: String,
    config: PathBuf,
    listen_yaml: String,
    child: Child,
}

impl Replica {
    /// Writes its config into `dir` and starts it; returns once `/healthz` answers.
    async fn start(dir: &Path, name: &str, shared_yaml: &str) -> Self {
        let (front_port, admin_port) = (free_port(), free_port());
        let config = dir.join(format!("{name}.yaml"));
        let listen_yaml =
            format!("listen: 127.0.0.1:{front_port}\nadmin_listen: 127.0.0.1:{admin_port}\n");
        std::fs::write(&config, format!("{listen_yaml}{shared_yaml}")).unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_grid-route-example"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let replica = Self {
            admin: format!("http://127.0.0.1:{admin_port}"),
            front: format!("http://127.0.0.1:{front_port}"),
            config,
            listen_yaml,
            child,
        };
        let healthz = format!("{}/healthz", replica.admin);
        eventually_within(&format!("{name} serves"), PROCESS_WAIT, || {
            let healthz = healthz.clone();
            async move {
                try_send(Method::GET, &healthz, Bytes::new())
                    .await
                    .is_some_and(|a| a.status == StatusCode::OK)
            }
        })
        .await;
        replica
    }

    /// Rewrites its config file with `yaml` (same listen addresses) and sends SIGHUP;
    /// returns once the reload is counted as applied.
    async fn reload(&self, yaml: &str) {
        let applied = "grid_serving_config_reload_total{result=\"applied\"}";
        let before = self.metric(applied).await;
        std::fs::write(&self.config, format!("{}{yaml}", self.listen_yaml)).unwrap();
        let pid = self.child.id().unwrap().to_string();
        let status = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .await
            .unwrap();
        assert!(status.success());
        eventually_within("the reload is applied", PROCESS_WAIT, || async {
            self.metric(applied).await > before
        })
        .await;
    }

    /// The value of one metric series in its Prometheus text (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        metric(&self.admin, series).await.unwrap_or(0.0)
    }

    async fn entries(&self, cluster: &str) -> f64 {
        self.metric(&format!(
            "grid_route_index_entries{{site=\"{}\",cluster=\"{cluster}\"}}",
            site_of(cluster)
        ))
        .await
    }

    async fn applied(&self) -> f64 {
        self.metric("grid_route_shared_index_events_total{direction=\"applied\"}")
            .await
    }

    async fn queue_depth(&self, engine: &str) -> f64 {
        let site = site_of(engine);
        self.metric(&format!(
            "grid_route_queue_depth{{site=\"{site}\",cluster=\"{engine}\"}}"
        ))
        .await
    }
}

// ---- the testbed --------------------------------------------------------------------

struct Testbed {
    dir: PathBuf,
    redis: Redis,
    east: MockEngine,
    west: MockEngine,
    /// The config every replica shares, without its listen addresses.
    shared_yaml: String,
    /// Owns `dir` (removed on drop); declared last, so it goes after the servers.
    _scratch: tempfile::TempDir,
}

impl Testbed {
    async fn start(name: &str) -> Self {
        let scratch = scratch_dir(&format!("shared-index-{name}"));
        let dir = scratch.path().to_owned();
        let redis = Redis::start(&dir).await;
        let (east, west) = (engine("east-a").await, engine("west-a").await);
        let tag_key = dir.join("tag.key");
        std::fs::write(&tag_key, [0x5a; 32]).unwrap();
        let mut shared_yaml = format!(
            // Fixed prices: the mock engines answer in microseconds, which would teach a
            // prefill speed that makes any match worth less than one queued request.
            "queue: {{ poll_interval_ms: 20, window_secs: 1 }}\n\
             grid_site_route:\n  prefix_affinity:\n    exploration: 0.0\n    \
             prefill_tokens_per_second: 10000\n    queued_request_seconds: 2\n    \
             tag_key_path: {}\n    shared_index: {{ redis_url: \"{}\", key_prefix: {name} }}\n\
             sites:\n",
            tag_key.display(),
            redis.url()
        );
        for engine in [&east, &west] {
            let cluster = engine.name();
            let _ = write!(
                shared_yaml,
                "  - name: {}\n    clusters:\n      - {{ name: {cluster}, models: [{MODEL}], endpoints: [{}] }}\n",
                site_of(cluster),
                engine.url()
            );
        }
        Self {
            dir,
            redis,
            east,
            west,
            shared_yaml,
            _scratch: scratch,
        }
    }

    async fn replica(&self, name: &str) -> Replica {
        Replica::start(&self.dir, name, &self.shared_yaml).await
    }

    fn engine(&self, name: &str) -> &MockEngine {
        if name == "east-a" {
            &self.east
        } else {
            &self.west
        }
    }

    /// Makes `home` one queued request heavier than the other engine, and waits until
    /// `replica` sees both depths.
    async fn weigh_down(&self, home: &str, replica: &Replica) {
        set_queue(self.engine(home), 1).await;
        set_queue(self.engine(other(home)), 0).await;
        eventually_within("the replica sees the queues", PROCESS_WAIT, || async {
            replica.queue_depth(home).await == 1.0 && replica.queue_depth(other(home)).await == 0.0
        })
        .await;
    }

    /// Every stream entry's raw field values, and every key in Redis.
    async fn redis_contents(&self, prefix: &str) -> (Vec<Vec<u8>>, Vec<String>) {
        let mut connection = connection(&self.redis.url()).await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream_key(prefix))
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .unwrap();
        let mut values = Vec::new();
        for entry in entries.ids {
            for (field, value) in entry.map {
                assert_eq!(field, EVENT_FIELD);
                let redis::Value::BulkString(bytes) = value else {
                    panic!("a stream value that is not bytes: {value:?}");
                };
                values.push(bytes);
            }
        }
        (values, keys)
    }
}

// ---- the client ---------------------------------------------------------------------

// ---- prompts ------------------------------------------------------------------------

// ---- tests --------------------------------------------------------------------------

#[tokio::test]
async fn a_follow_up_through_the_other_replica_stays_on_the_first_turns_site() {
    let bed = Testbed::start("follow-up").await;
    let (a, b) = (bed.replica("a").await, bed.replica("b").await);
    for topic in ["zebra", "quokka"] {
        let mut conversation = Conversation::new(topic, SYSTEM_BYTES);
        let first = conversation.turn(&a.front, "hello").await;
        assert_eq!(first.status, StatusCode::OK);
        let home = first.engine_name();
        eventually_within("replica b learns the first turn", PROCESS_WAIT, || async {
            b.entries(&home).await > 0.0
        })
        .await;
        bed.weigh_down(&home, &b).await;
        assert_eq!(
            conversation.turn(&b.front, "and then?").await.engine_name(),
            home
        );
    }
    assert!(b.applied().await >= 2.0);
    assert!(
        a.metric("grid_route_shared_index_events_total{direction=\"published\"}")
            .await
            >= 2.0
    );
}

#[tokio::test]
async fn a_restarted_replica_is_sticky_at_once() {
    let bed = Testbed::start("restart").await;
    let a = bed.replica("a").await;
    let b = bed.replica("b").await;
    drop(b);
    // Learned while b is down: b can only know it by replaying the stream.
    let mut conversation = Conversation::new("pangolin", SYSTEM_BYTES);
    let home = conversation.turn(&a.front, "hello").await.engine_name();
    eventually_within("a publishes the first turn", PROCESS_WAIT, || async {
        a.metric("grid_route_shared_index_events_total{direction=\"published\"}")
            .await
            >= 1.0
    })
    .await;
    let b = bed.replica("b-again").await;
    // Warm from its first scrape: the replay happened before it served.
    assert!(b.entries(&home).await > 0.0);
    bed.weigh_down(&home, &b).await;
    assert_eq!(
        conversation
            .turn(&b.front, "still there?")
            .await
            .engine_name(),
        home
    );
}

#[tokio::test]
async fn stopping_redis_fails_no_request_and_sharing_resumes_when_it_returns() {
    let mut bed = Testbed::start("outage").await;
    let (a, b) = (bed.replica("a").await, bed.replica("b").await);
    bed.redis.stop().await;
    for (i, replica) in [&a, &b, &a, &b, &a, &b].into_iter().enumerate() {
        let mut conversation = Conversation::new(&format!("outage{i}"), SYSTEM_BYTES);
        let first = conversation.turn(&replica.front, "hello").await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text());
        let second = conversation.turn(&replica.front, "and?").await;
        assert_eq!(second.status, StatusCode::OK, "{}", second.text());
        // Routing goes on with the local index.
        assert_eq!(second.engine_name(), first.engine_name());
    }
    eventually_within("both replicas count Redis errors", PROCESS_WAIT, || async {
        a.metric("grid_route_shared_index_errors_total").await > 0.0
            && b.metric("grid_route_shared_index_errors_total").await > 0.0
    })
    .await;

    bed.redis.restart().await;
    // Events sent while a replica had not yet noticed the restart may be lost (a lost
    // event costs a miss); new first turns go through until b applies one.
    let deadline = Instant::now() + PROCESS_WAIT;
    let mut attempt = 0;
    let (mut conversation, home) = 'resumed: loop {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for b to apply an event"
        );
        attempt += 1;
        let before = b.applied().await;
        let mut conversation = Conversation::new(&format!("resumed{attempt}"), SYSTEM_BYTES);
        let home = conversation.turn(&a.front, "hello").await.engine_name();
        let applied_by = Instant::now() + Duration::from_secs(1);
        while Instant::now() < applied_by {
            if b.applied().await > before {
                break 'resumed (conversation, home);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    bed.weigh_down(&home, &b).await;
    assert_eq!(
        conversation.turn(&b.front, "and then?").await.engine_name(),
        home
    );
}

#[tokio::test]
async fn a_replica_with_another_tag_key_applies_no_peer_event() {
    let bed = Testbed::start("other-key").await;
    let other_key = bed.dir.join("other.key");
    std::fs::write(&other_key, [0xa5; 32]).unwrap();
    let tag_key = bed.dir.join("tag.key");
    let rotated = bed.shared_yaml.replace(
        &tag_key.display().to_string(),
        &other_key.display().to_string(),
    );
    let (a, b) = (bed.replica("a").await, bed.replica("b").await);
    let c = Replica::start(&bed.dir, "c", &rotated).await;
    let mut conversation = Conversation::new("axolotl", SYSTEM_BYTES);
    let home = conversation.turn(&a.front, "hello").await.engine_name();
    eventually_within("b learns the first turn", PROCESS_WAIT, || async {
        b.entries(&home).await > 0.0
    })
    .await;
    // c read the same stream (it was up before the event) but keys under another seed.
    assert_eq!(c.entries(&home).await, 0.0);
    assert_eq!(c.applied().await, 0.0);
}

#[tokio::test]
async fn a_reload_that_adds_shared_index_starts_sharing() {
    let bed = Testbed::start("reload").await;
    let alone = bed
        .shared_yaml
        .lines()
        .filter(|line| !line.contains("shared_index"))
        .collect::<Vec<_>>()
        .join("\n");
    let a = bed.replica("a").await;
    let b = Replica::start(&bed.dir, "b", &format!("{alone}\n")).await;
    let mut before = Conversation::new("wombat", SYSTEM_BYTES);
    let home = before.turn(&a.front, "hello").await.engine_name();
    // b does not share yet, and keys under a seed of its own.
    assert_eq!(b.entries(&home).await, 0.0);

    b.reload(&bed.shared_yaml).await;
    // Sharing started: b replays what a published before, now under the same seed.
    eventually_within("b replays the stream", PROCESS_WAIT, || async {
        b.entries(&home).await > 0.0
    })
    .await;
    bed.weigh_down(&home, &b).await;
    assert_eq!(before.turn(&b.front, "and then?").await.engine_name(), home);
}

#[tokio::test]
async fn redis_holds_keys_and_no_prompt_text() {
    let bed = Testbed::start("no-text").await;
    let (a, b) = (bed.replica("a").await, bed.replica("b").await);
    let mut conversation = Conversation::new("ocelot", SYSTEM_BYTES);
    let home = conversation
        .turn(&a.front, "what about the narwhal?")
        .await
        .engine_name();
    eventually_within("b learns the first turn", PROCESS_WAIT, || async {
        b.entries(&home).await > 0.0
    })
    .await;
    let (values, keys) = bed.redis_contents("no-text").await;
    assert_eq!(keys, [stream_key("no-text")]);
    assert!(!values.is_empty());
    for value in &values {
        let event = WireEvent::decode(value).unwrap();
        assert!(!event.keys.is_empty());
        let text = String::from_utf8_lossy(value).to_lowercase();
        for word in [
            "ocelot",
            "narwhal",
            "rule",
            "answer",
            "precisely",
            "hello",
            "demo-model",
            "system",
            "user",
        ] {
            assert!(!text.contains(word), "Redis holds {word:?}");
        }
    }
}

#[tokio::test]
async fn a_session_or_thread_answered_through_one_replica_keeps_its_next_turn_through_the_other() {
    let bed = Testbed::start("session").await;
    let (a, b) = (bed.replica("a").await, bed.replica("b").await);
    // No system prompt, a first turn under the four keys a match needs, a second one four
    // times as long: the second turn cannot stick by its prefix, and by the index's room
    // alone it would go to the engine holding less, away from the first turn's.
    // First a client that names its session and rewrites its history (it stamps the turn
    // on its first message): the turn does not continue the first to the byte, so its
    // thread names nothing and only the session can keep it. Then one that names no
    // session and sends its history back as it was: only the thread can keep it.
    for (n, (animal, session)) in [("okapi", Some("conversation-okapi")), ("quagga", None)]
        .into_iter()
        .enumerate()
    {
        let question = format!("a short first question about the {animal} ").repeat(16);
        let body = |messages: &Value| {
            let mut body = json!({"model": MODEL, "messages": messages});
            if let Some(session) = session {
                body["prompt_cache_key"] = session.into();
            }
            serde_json::to_vec(&body).unwrap()
        };
        let mut messages = json!([{"role": "user", "content": question}]);
        let applied = b.applied().await;
        let first = send(
            Method::POST,
            &format!("{}/v1/chat/completions", a.front),
            body(&messages),
        )
        .await;
        assert_eq!(first.status, StatusCode::OK);
        let home = first.engine_name();
        // The first turn's keys, then its session if it names one, then its thread.
        let events = if session.is_some() { 3.0 } else { 2.0 };
        eventually_within(
            "replica b learns the first turn, its session and its thread",
            PROCESS_WAIT,
            || async { b.applied().await >= applied + events },
        )
        .await;
        let reply: Value = serde_json::from_slice(&first.body).unwrap();
        let turns = messages.as_array_mut().unwrap();
        if session.is_some() {
            turns[0]["content"] = format!("[turn 1] {question}").into();
        }
        turns.push(
            json!({"role": "assistant", "content": reply["choices"][0]["message"]["content"]}),
        );
        turns.push(
            json!({"role": "user", "content": "and now a much longer question ".repeat(100)}),
        );
        let second = send(
            Method::POST,
            &format!("{}/v1/chat/completions", b.front),
            body(&messages),
        )
        .await;
        assert_eq!(second.engine_name(), home, "{animal}");
        assert_eq!(
            b.metric("grid_route_prefix_affinity_total{outcome=\"session\"}")
                .await,
            n as f64 + 1.0,
            "{animal}"
        );
    }
}
