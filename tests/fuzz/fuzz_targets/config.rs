//! The config loader (`GatewayConfig::from_yaml`, then `validate`) on arbitrary text.
//!
//! Holds: no panic, and no abort from a huge allocation, whatever the YAML; reading the
//! same text twice gives the same config; a refused config has a message that names what
//! is wrong; an accepted one is one the gateway can run: distinct listen addresses (unless
//! one asks for any port), a poll interval of at least 10 ms, a body limit of at least one
//! byte, and a grid that builds from it.
//!
//! `tag_key_path` is cleared before validating, so the target never reads a file.
#![no_main]

use grid_route_example::config::{ConfigError, GatewayConfig, MIN_POLL_INTERVAL_MS};
use grid_route_layer::grid::Grid;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = GatewayConfig::from_yaml(text);
    let again = GatewayConfig::from_yaml(text);
    assert_eq!(format!("{first:?}"), format!("{again:?}"));
    let mut config = match first {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    config.grid_site_route.prefix_affinity.settings.tag_key_path = None;
    match config.validate() {
        Ok(checked) => {
            assert!(checked.listen != checked.admin_listen || checked.listen.port() == 0);
            assert!(checked.poll_interval.as_millis() >= u128::from(MIN_POLL_INTERVAL_MS));
            assert!(checked.max_body_bytes >= 1);
            // A named metric is never empty; none means each endpoint's gauge is found.
            assert!(
                checked
                    .queue_metric
                    .as_deref()
                    .is_none_or(|m| !m.is_empty())
            );
            // The window covers two polls.
            assert!(checked.grid_settings.queue_window >= 2 * checked.poll_interval);
            Grid::new(&checked.grid_spec, checked.grid_settings.clone())
                .expect("a validated config builds its grid");
        }
        Err(ConfigError::Invalid { field, .. }) => assert!(!field.is_empty()),
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
