//! The demo's progress on stderr: a line per phase, and a running count of the requests
//! answered (rewritten in place on a terminal, a line per quarter otherwise).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where [`run`](super::run) reports its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nowhere (tests).
    Quiet,
    /// On stderr, so that stdout holds the table alone.
    Stderr,
}

impl Progress {
    /// Prints one phase line.
    pub(crate) fn phase(self, line: &str) {
        if self == Progress::Stderr {
            eprintln!("{line}");
        }
    }
}

/// How often the running count is redrawn.
const TICK: Duration = Duration::from_millis(200);

/// A running count of answered requests, shown while a run replays.
pub(crate) struct RunningCount {
    done: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
    ticker: Option<JoinHandle<()>>,
}

impl RunningCount {
    /// Starts showing `label: N/total requests` (when `progress` is [`Progress::Stderr`]).
    pub(crate) fn start(progress: Progress, label: String, total: usize) -> Self {
        let done = Arc::new(AtomicUsize::new(0));
        let (stop, mut stopped) = watch::channel(false);
        let ticker = (progress == Progress::Stderr).then(|| {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let terminal = std::io::stderr().is_terminal();
                let mut shown_quarter = 0;
                loop {
                    let stopping = tokio::time::timeout(TICK, stopped.changed()).await.is_ok();
                    let now = done.load(Ordering::Relaxed).min(total);
                    if terminal {
                        let end = if stopping { "\n" } else { "" };
                        eprint!("\r{label}: {now}/{total} requests{end}");
                        let _ = std::io::stderr().flush();
                    } else {
                        let quarter = (now * 4).checked_div(total).unwrap_or(4);
                        if quarter > shown_quarter {
                            shown_quarter = quarter;
                            eprintln!("{label}: {now}/{total} requests");
                        }
                    }
                    if stopping {
                        break;
                    }
                }
            })
        });
        Self { done, stop, ticker }
    }

    /// The counter the replay adds each finished request to.
    pub(crate) fn counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.done)
    }

    /// Shows the final count and stops.
    pub(crate) async fn finish(mut self) {
        self.stop.send_replace(true);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.await;
        }
    }
}
