//! Replaying the workload through a gateway: sessions run concurrently, each session's
//! turns in order, every answer tallied.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::client::{Answer, ChatAnswer, DemoClient, PromptUsage, RequestError};
use super::progress::RunningCount;
use super::report::{RunReport, affinity_counts, outcome_difference};
use super::testbed::{MODEL, SITES, Testbed};
use super::workload::{Session, Workload};

/// Failures kept for the error message.
const KEPT_FAILURES: usize = 5;

/// What the requests of one or more sessions got.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    requests_ok: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft: Vec<Duration>,
    by_engine: BTreeMap<String, u64>,
    pinned: u64,
    pinned_ok: u64,
    failures: Vec<String>,
}

impl Tally {
    fn usage(&mut self, usage: Option<PromptUsage>) {
        if let Some(usage) = usage {
            self.prompt_tokens += usage.prompt_tokens;
            self.cached_tokens += usage.cached_tokens;
        }
    }

    fn answered_by(&mut self, engine: Option<&String>) {
        if let Some(engine) = engine {
            *self.by_engine.entry(engine.clone()).or_default() += 1;
        }
    }

    fn fail(&mut self, what: String) {
        if self.failures.len() < KEPT_FAILURES {
            self.failures.push(what);
        }
    }

    /// Counts a whole answer (or its absence); `pinned` when it named stored state.
    fn answer(&mut self, answer: &Result<Answer, RequestError>, pinned: bool) -> bool {
        self.requests += 1;
        self.pinned += u64::from(pinned);
        match answer {
            Ok(answer) => {
                self.answered_by(answer.engine.as_ref());
                if answer.ok() {
                    self.requests_ok += 1;
                    self.pinned_ok += u64::from(pinned);
                    self.usage(answer.responses_usage());
                    true
                } else {
                    self.fail(answer.failure());
                    false
                }
            }
            Err(error) => {
                self.fail(error.clone());
                false
            }
        }
    }

    fn chat(&mut self, answer: &Result<ChatAnswer, RequestError>) -> bool {
        self.requests += 1;
        match answer {
            Ok(answer) => {
                self.answered_by(answer.engine.as_ref());
                if answer.ok() {
                    self.requests_ok += 1;
                    self.usage(answer.usage);
                    self.ttft.extend(answer.time_to_first_token);
                    true
                } else {
                    self.fail(answer.failure());
                    false
                }
            }
            Err(error) => {
                self.fail(error.clone());
                false
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.requests_ok += other.requests_ok;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.ttft.extend(other.ttft);
        for (engine, count) in other.by_engine {
            *self.by_engine.entry(engine).or_default() += count;
        }
        self.pinned += other.pinned;
        self.pinned_ok += other.pinned_ok;
        for failure in other.failures {
            self.fail(failure);
        }
    }
}

/// Replays `workload` through `bed`'s gateway, `concurrency` sessions at a time, counting
/// each finished request on `count`.
pub(crate) async fn replay(
    bed: &Testbed,
    workload: &Workload,
    concurrency: usize,
    count: &RunningCount,
    affinity: bool,
) -> RunReport {
    let client = DemoClient::new(bed.gateway.url());
    let admin = DemoClient::new(bed.gateway.admin_url());
    // The recorder is process-wide: earlier runs' decisions are in it too.
    let before = admin.get_text("/metrics").await.unwrap_or_default();
    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut sessions = JoinSet::new();
    for session in workload.sessions.iter().cloned() {
        let client = client.clone();
        let slots = Arc::clone(&slots);
        let done = count.counter();
        sessions.spawn(async move {
            // The semaphore is never closed, so a permit always comes.
            let _slot = slots.acquire_owned().await;
            run_session(&client, session, &done).await
        });
    }
    let mut tally = Tally::default();
    while let Some(joined) = sessions.join_next().await {
        match joined {
            Ok(session) => tally.merge(session),
            Err(error) => tally.fail(format!("a session task failed: {error}")),
        }
    }
    let elapsed = started.elapsed();
    let after = admin.get_text("/metrics").await.unwrap_or_default();
    tally.ttft.sort_unstable();
    let requests_per_site = SITES
        .iter()
        .map(|site| {
            let answered = tally
                .by_engine
                .iter()
                .filter(|(engine, _)| bed.site_of(engine) == Some(site))
                .map(|(_, n)| *n)
                .sum();
            ((*site).to_owned(), answered)
        })
        .collect();
    RunReport {
        affinity,
        requests: tally.requests,
        requests_ok: tally.requests_ok,
        prompt_tokens: tally.prompt_tokens,
        cached_tokens: tally.cached_tokens,
        ttft: tally.ttft,
        requests_per_site,
        affinity_outcomes: outcome_difference(&affinity_counts(&before), &affinity_counts(&after)),
        pinned_follow_ups: tally.pinned,
        pinned_follow_ups_ok: tally.pinned_ok,
        elapsed,
        failures: tally.failures,
    }
}

async fn run_session(client: &DemoClient, session: Session, done: &AtomicUsize) -> Tally {
    let mut tally = Tally::default();
    match session {
        Session::Chat {
            system, questions, ..
        } => {
            let mut messages = vec![json!({"role": "system", "content": &*system})];
            for question in questions {
                messages.push(json!({"role": "user", "content": question}));
                let body = json!({
                    "model": MODEL,
                    "messages": messages,
                    "stream": true,
                    "stream_options": {"include_usage": true},
                });
                let answer = client.stream_chat(&body).await;
                if tally.chat(&answer)
                    && let Ok(answer) = answer
                {
                    messages.push(json!({"role": "assistant", "content": answer.reply}));
                } else {
                    // A failed turn is not part of the history; the next one follows the
                    // last answered turn.
                    messages.pop();
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
        Session::ResponsesChain {
            instructions,
            inputs,
        } => {
            let mut previous: Option<String> = None;
            for input in inputs {
                let mut body =
                    json!({"model": MODEL, "instructions": &*instructions, "input": input});
                if let Some(previous) = &previous {
                    body["previous_response_id"] = json!(previous);
                }
                let answer = client.post_json("/v1/responses", &body).await;
                let pinned = previous.is_some();
                if tally.answer(&answer, pinned)
                    && let Ok(answer) = &answer
                {
                    // The gateway's tagged id: it names the cluster holding the response.
                    previous = answer.id().or(previous);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
        Session::Conversation {
            instructions,
            inputs,
        } => {
            let created = client
                .post_json(
                    "/v1/conversations",
                    &json!({"metadata": {"demo": "grid-route"}}),
                )
                .await;
            let conversation = if tally.answer(&created, false) {
                created.ok().and_then(|answer| answer.id())
            } else {
                None
            };
            done.fetch_add(1, Ordering::Relaxed);
            let Some(conversation) = conversation else {
                done.fetch_add(inputs.len(), Ordering::Relaxed);
                return tally;
            };
            for input in inputs {
                let body = json!({
                    "model": MODEL,
                    "instructions": &*instructions,
                    "conversation": conversation,
                    "input": input,
                });
                let answer = client.post_json("/v1/responses", &body).await;
                tally.answer(&answer, true);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    tally
}
