//! The `mock-engine` subcommand: its arguments and its run loop.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use tokio::net::TcpListener;

use super::{MockEngineConfig, serve};

/// Usage of the `mock-engine` subcommand.
pub const USAGE: &str = "usage: grid-route-example mock-engine --listen ADDR --name NAME [options]

options:
  --listen ADDR                  address to listen on, e.g. 127.0.0.1:8001 (required)
  --name NAME                    engine name in replies, x-mock-engine and logs (required)
  --model M                      a served model; repeat for more (default demo-model)
  --max-running N                requests that run at once; more wait (default 4)
  --prefill-tokens-per-second N  uncached prompt tokens prefilled a second; 0: instant
                                 (default 20000)
  --decode-ms-per-token N        milliseconds to decode one output token (default 1)
  --cache-blocks N               prefix cache capacity in blocks; 0: no cache (default 4096)
  --block-bytes N                prompt bytes a cache block holds (default 256)
";

/// The parsed arguments of `mock-engine`.
#[derive(Debug, Clone)]
pub struct MockEngineArgs {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The engine's configuration.
    pub config: MockEngineConfig,
}

fn number<T>(flag: &str, value: &str, at_least: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    value
        .parse::<T>()
        .ok()
        .filter(|n| *n >= at_least)
        .ok_or_else(|| format!("{flag} must be an integer of at least {at_least}, got {value:?}"))
}

/// Parses the arguments after `mock-engine`; the error says what is wrong, for a usage
/// message. Flags take their value as the next argument or after `=`.
pub fn parse_args(args: &[String]) -> Result<MockEngineArgs, String> {
    let mut config = MockEngineConfig::default();
    let mut listen = None;
    let mut name = None;
    let mut models = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        if !flag.starts_with("--") {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let known = [
            "--listen",
            "--name",
            "--model",
            "--max-running",
            "--prefill-tokens-per-second",
            "--decode-ms-per-token",
            "--cache-blocks",
            "--block-bytes",
        ];
        if !known.contains(&flag) {
            return Err(format!("unknown option {flag}"));
        }
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        match flag {
            "--listen" => listen = Some(socket_addr(&value)?),
            "--name" if value.is_empty() => return Err("--name must not be empty".to_owned()),
            "--name" => name = Some(value),
            "--model" if value.is_empty() => return Err("--model must not be empty".to_owned()),
            "--model" => models.push(value),
            "--max-running" => config.max_running = number(flag, &value, 1)?,
            "--prefill-tokens-per-second" => {
                config.prefill_tokens_per_second = number(flag, &value, 0)?;
            }
            "--decode-ms-per-token" => {
                config.decode_delay_per_token = Duration::from_millis(number(flag, &value, 0)?);
            }
            "--cache-blocks" => config.cache_blocks = number(flag, &value, 0)?,
            _ => config.block_bytes = number(flag, &value, 1)?,
        }
    }
    config.name = name.ok_or("--name is required")?;
    if !models.is_empty() {
        config.models = models;
    }
    Ok(MockEngineArgs {
        listen: listen.ok_or("--listen is required")?,
        config,
    })
}

fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    value
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("--listen must be an address like 127.0.0.1:8001, got {value:?}"))
}

/// Runs the engine until ctrl-c (or SIGTERM), then finishes the requests in flight.
pub async fn run(args: MockEngineArgs) -> io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    let config = &args.config;
    tracing::info!(
        name = %config.name,
        listen = %listener.local_addr()?,
        models = ?config.models,
        max_running = config.max_running,
        prefill_tokens_per_second = config.prefill_tokens_per_second,
        decode_ms_per_token = config.decode_delay_per_token.as_millis(),
        cache_blocks = config.cache_blocks,
        block_bytes = config.block_bytes,
        "mock engine listening"
    );
    let name = config.name.clone();
    serve(listener, args.config, stop_signal()).await?;
    tracing::info!(name = %name, "mock engine stopped");
    Ok(())
}

/// Completes on ctrl-c or, on Unix, SIGTERM.
async fn stop_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("stop signal received; finishing requests in flight");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn all_flags_parse_into_the_config() {
        let parsed = parse_args(&args(
            "--listen 127.0.0.1:8001 --name east-a --model a --model=b --max-running 2 \
             --prefill-tokens-per-second 500 --decode-ms-per-token 0 --cache-blocks 10 \
             --block-bytes 64",
        ))
        .unwrap();
        assert_eq!(parsed.listen, "127.0.0.1:8001".parse().unwrap());
        let config = parsed.config;
        assert_eq!(config.name, "east-a");
        assert_eq!(config.models, ["a", "b"]);
        assert_eq!(config.max_running, 2);
        assert_eq!(config.prefill_tokens_per_second, 500);
        assert_eq!(config.decode_delay_per_token, Duration::ZERO);
        assert_eq!(config.cache_blocks, 10);
        assert_eq!(config.block_bytes, 64);
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let error = |line: &str| parse_args(&args(line)).unwrap_err();
        assert_eq!(error("--name a"), "--listen is required");
        assert_eq!(error("--listen 127.0.0.1:1"), "--name is required");
        assert_eq!(
            error("--listen 127.0.0.1:1 --name a --bogus 1"),
            "unknown option --bogus"
        );
        assert_eq!(error("--listen 127.0.0.1:1 --name"), "--name needs a value");
        assert!(error("--listen nowhere --name a").contains("--listen must be an address"));
        assert!(error("--listen 127.0.0.1:1 --name a --max-running 0").contains("at least 1"));
        assert!(error("--listen 127.0.0.1:1 --name a --cache-blocks x").contains("\"x\""));
        assert!(error("stray").contains("unexpected argument"));
    }
}
