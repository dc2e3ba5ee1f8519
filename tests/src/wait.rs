//! Waiting for a condition, never for a guessed duration.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits before it fails the test.
pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `condition` holds, polling every 10 ms; fails the test, naming `what`,
/// after [`WAIT`].
pub async fn eventually<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, WAIT, condition).await;
}

/// [`eventually`] with a deadline of `within` (a process's start or a replication takes
/// longer than a change inside this process).
pub async fn eventually_within<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
