//! `tests/llama/setup` checks the engine binary it hands the real-engine tests: a cached
//! binary that cannot serve on this machine fails the setup in seconds, naming why.
//!
//! Each test lays out a cache of its own (`GRID_ROUTE_LLAMA_CACHE`) holding a stand-in
//! `llama-server` with the stamp this machine wants, so the setup takes it as cached and
//! builds nothing; the check then starts it as it would start the real one. Needs bash and
//! python3, as the setup does.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Held by each test for its whole run: a stand-in binary written while another test forks
/// could be busy (`ETXTBSY`) when the setup runs it, so the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("llama/setup")
}

/// A cache whose `bin/llama-server` is the shell script `server`, stamped as built for this
/// machine, beside a model file.
fn cache_with_server(server: &str) -> tempfile::TempDir {
    let cache = tempfile::tempdir().unwrap();
    let bin = cache.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let binary = bin.join("llama-server");
    std::fs::write(&binary, server).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut stamp = Command::new(setup_script());
    stamp.arg("--stamp");
    let stamp = run_within(&mut stamp, Duration::from_secs(20));
    assert!(stamp.status.success(), "{stamp:?}");
    std::fs::write(bin.join(".stamp"), &stamp.stdout).unwrap();
    std::fs::write(
        cache.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        b"GGUF",
    )
    .unwrap();
    cache
}

/// Runs the setup on `cache`; fails the test when it takes longer than `within`.
fn run_setup(cache: &Path, check_secs: u32, within: Duration) -> Output {
    let mut setup = Command::new(setup_script());
    setup
        .env("GRID_ROUTE_LLAMA_CACHE", cache)
        .env("GRID_ROUTE_LLAMA_CHECK_SECS", check_secs.to_string());
    run_within(&mut setup, within)
}

/// Runs `command` to its end; fails the test (killing it) when that takes longer than
/// `within`.
fn run_within(command: &mut Command, within: Duration) -> Output {
    let started = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > within {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{command:?} took more than {within:?}; it said:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_cached_engine_that_crashes_on_load_fails_the_setup_in_seconds_naming_the_cause() {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // What the native build did on Intel CPUs with AMX: a log line, then a segfault.
    let cache = cache_with_server(
        "#!/bin/sh\necho 'llama threadpool init, n_threads = 1'\nkill -SEGV $$\n",
    );
    let output = run_setup(cache.path(), 60, Duration::from_secs(20));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the setup passed a crashing engine:\n{said}"
    );
    assert!(
        output.stdout.is_empty(),
        "printed paths for a crashing engine"
    );
    assert!(said.contains("died of signal SIGSEGV"), "{said}");
    assert!(said.contains("llama threadpool init"), "{said}");
    assert!(said.contains("built for: llama-cpp-python"), "{said}");
    assert!(said.contains("its instruction-set flags:"), "{said}");
    assert!(said.contains("rm -rf"), "no way to rebuild named:\n{said}");
}

#[test]
fn a_cached_engine_that_never_answers_fails_the_setup_at_its_deadline() {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = cache_with_server("#!/bin/sh\necho 'loading model'\nexec sleep 600\n");
    let output = run_setup(cache.path(), 2, Duration::from_secs(20));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the setup passed a silent engine:\n{said}"
    );
    assert!(said.contains("did not answer within 2 s"), "{said}");
    assert!(said.contains("loading model"), "{said}");
}
