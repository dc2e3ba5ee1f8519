//! `serve --config FILE.yaml`: a gateway driven by its config file and Unix signals.

use std::path::Path;

use super::{Gateway, GatewayError};
use crate::config::GatewayConfig;

/// Runs a gateway from the config file at `path` until SIGTERM or ctrl-c, then drains it
/// (see [`Gateway::shutdown`]). SIGHUP re-reads the file and [reloads](Gateway::reload)
/// it; a bad file keeps the running config and logs why.
pub async fn serve(path: &Path) -> Result<(), GatewayError> {
    let config = GatewayConfig::from_file(path).map_err(|source| GatewayError::ConfigFile {
        path: path.to_owned(),
        source,
    })?;
    let gateway = Gateway::start(config).await?;
    tracing::info!(config = %path.display(), "serving; SIGHUP reloads, SIGTERM or ctrl-c drains and stops");
    wait_for_stop(&gateway, path).await?;
    gateway.shutdown().await
}

#[cfg(unix)]
async fn wait_for_stop(gateway: &Gateway, path: &Path) -> Result<(), GatewayError> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                tracing::info!(config = %path.display(), "SIGHUP: reloading the config file");
                // A refused reload is counted and logged by `reload_file`; the gateway
                // keeps serving the running config.
                let _ = gateway.reload_file(path);
            }
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: draining");
                return Ok(());
            }
            interrupted = tokio::signal::ctrl_c() => {
                interrupted?;
                tracing::info!("interrupted: draining");
                return Ok(());
            }
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_stop(_gateway: &Gateway, _path: &Path) -> Result<(), GatewayError> {
    tokio::signal::ctrl_c().await?;
    tracing::info!("interrupted: draining");
    Ok(())
}
