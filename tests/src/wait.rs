//! Waiting for a condition, never for a guessed duration.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits before it fails the test.
pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `condition` holds, polling every 10 ms; fails the test, naming `what`,
/// after [`WAIT`].
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
