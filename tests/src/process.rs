//! Processes the tests start: signals, and waiting for one to exit.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a test waits for a process to start, reload or stop.
pub const PROCESS_WAIT: Duration = Duration::from_secs(20);

/// Sends `name` (`-HUP`, `-TERM`, `-KILL`, `-STOP`, `-CONT`) to the process `pid`.
pub fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {name} {pid}");
}

/// Waits for `child` to exit, failing after `within`.
pub async fn exit_within(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            return exit;
        }
        assert!(
            Instant::now() < deadline,
            "the process did not stop in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
