//! The `mock-engine` subcommand: its arguments and its run loop.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::builder::{NonEmptyStringValueParser, RangedU64ValueParser};
use tokio::net::TcpListener;

use super::{MockEngineConfig, serve};

/// The arguments of `grid-route-example mock-engine`. Every default is
/// [`MockEngineConfig::default`]'s, so the flags and the in-process engine agree.
#[derive(Debug, Clone, clap::Args)]
pub struct MockEngineArgs {
    /// Address to listen on, e.g. 127.0.0.1:8001 (a host name resolves to its first
    /// address).
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    pub listen: SocketAddr,
    /// Engine name in replies, the x-mock-engine header and logs.
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
    /// A served model; repeat for more. The first serves requests that name no model.
    #[arg(
        long = "model",
        value_name = "M",
        default_values_t = MockEngineConfig::default().models,
        value_parser = NonEmptyStringValueParser::new(),
    )]
    pub models: Vec<String>,
    /// Requests that run at once; more wait in the queue.
    #[arg(
        long,
        value_name = "N",
        default_value_t = MockEngineConfig::default().max_running,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_PERMITS),
    )]
    pub max_running: usize,
    /// Uncached prompt tokens prefilled a second; 0: prefill is instant.
    #[arg(long, value_name = "N", default_value_t = MockEngineConfig::default().prefill_tokens_per_second)]
    pub prefill_tokens_per_second: u64,
    /// Milliseconds to decode one output token.
    #[arg(long, value_name = "MS", default_value_t = default_decode_ms_per_token())]
    pub decode_ms_per_token: u64,
    /// Prefix cache capacity in blocks; 0: no cache.
    #[arg(long, value_name = "N", default_value_t = MockEngineConfig::default().cache_blocks)]
    pub cache_blocks: usize,
    /// Prompt bytes a cache block holds.
    #[arg(
        long,
        value_name = "N",
        default_value_t = MockEngineConfig::default().block_bytes,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..),
    )]
    pub block_bytes: usize,
}

/// The most requests the engine can run at once: the permits of its semaphore.
const MAX_PERMITS: u64 = tokio::sync::Semaphore::MAX_PERMITS as u64;

fn default_decode_ms_per_token() -> u64 {
    u64::try_from(
        MockEngineConfig::default()
            .decode_delay_per_token
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

impl MockEngineArgs {
    /// The engine configuration these flags describe.
    pub fn config(&self) -> MockEngineConfig {
        MockEngineConfig {
            name: self.name.clone(),
            models: self.models.clone(),
            max_running: self.max_running,
            prefill_tokens_per_second: self.prefill_tokens_per_second,
            decode_delay_per_token: Duration::from_millis(self.decode_ms_per_token),
            cache_blocks: self.cache_blocks,
            block_bytes: self.block_bytes,
            ..MockEngineConfig::default()
        }
    }
}

/// `--listen`: a socket address, or a host name and port resolved to its first address.
fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    value
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("expected an address like 127.0.0.1:8001, got {value:?}"))
}

/// Runs the engine until ctrl-c (or SIGTERM), then finishes the requests in flight.
pub async fn run(args: MockEngineArgs) -> io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    let config = args.config();
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
    serve(listener, config, stop_signal()).await?;
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
    use clap::Parser;

    use super::*;

    /// `mock-engine`'s flags as a command of their own.
    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: MockEngineArgs,
    }

    fn parse(line: &str) -> Result<MockEngineArgs, String> {
        Command::try_parse_from(std::iter::once("mock-engine").chain(line.split_whitespace()))
            .map(|command| command.args)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn all_flags_parse_into_the_config() {
        let parsed = parse(
            "--listen 127.0.0.1:8001 --name east-a --model a --model=b --max-running 2 \
             --prefill-tokens-per-second 500 --decode-ms-per-token 0 --cache-blocks 10 \
             --block-bytes 64",
        )
        .unwrap();
        assert_eq!(parsed.listen, "127.0.0.1:8001".parse().unwrap());
        let config = parsed.config();
        assert_eq!(config.name, "east-a");
        assert_eq!(config.models, ["a", "b"]);
        assert_eq!(config.max_running, 2);
        assert_eq!(config.prefill_tokens_per_second, 500);
        assert_eq!(config.decode_delay_per_token, Duration::ZERO);
        assert_eq!(config.cache_blocks, 10);
        assert_eq!(config.block_bytes, 64);
    }

    #[test]
    fn unset_flags_take_the_engine_defaults() {
        let config = parse("--listen 127.0.0.1:8001 --name east-a")
            .unwrap()
            .config();
        let default = MockEngineConfig::named("east-a");
        assert_eq!(config.models, default.models);
        assert_eq!(config.max_running, default.max_running);
        assert_eq!(
            config.prefill_tokens_per_second,
            default.prefill_tokens_per_second
        );
        assert_eq!(
            config.decode_delay_per_token,
            default.decode_delay_per_token
        );
        assert_eq!(config.cache_blocks, default.cache_blocks);
        assert_eq!(config.block_bytes, default.block_bytes);
        assert_eq!(config.max_body_bytes, default.max_body_bytes);
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let error = |line: &str| parse(line).unwrap_err();
        assert!(error("--name a").contains("--listen <ADDR>"));
        assert!(error("--listen 127.0.0.1:1").contains("--name <NAME>"));
        assert!(error("--listen 127.0.0.1:1 --name a --bogus 1").contains("'--bogus'"));
        assert!(error("--listen 127.0.0.1:1 --name").contains("a value is required"));
        assert!(error("--listen nowhere --name a").contains("expected an address"));
        assert!(error("--listen 127.0.0.1:1 --name a --max-running 0").contains("'0'"));
        assert!(error("--listen 127.0.0.1:1 --name a --cache-blocks x").contains("'x'"));
        assert!(error("--listen 127.0.0.1:1 --name a --model=").contains("--model"));
        assert!(error("--listen 127.0.0.1:1 --name a stray").contains("'stray'"));
    }
}
