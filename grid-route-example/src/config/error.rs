//! Why a configuration was refused: every [`ConfigError`] names the field and the bad
//! value.

use std::fmt;
use std::io;
use std::path::PathBuf;

use grid_route_layer::grid::GridError;
use grid_route_layer::pin::TagKeyError;

/// A configuration that was refused; the message names the field and the bad value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The path that was read.
        path: PathBuf,
        /// Why reading failed.
        source: io::Error,
    },
    /// The YAML is malformed, has an unknown field, misses `sites`, or holds a value of
    /// the wrong type; the message names the field and its place in the file.
    #[error("invalid config: {0}")]
    Parse(#[source] serde_norway::Error),
    /// `sites`, `local_site` or `queue.window_secs`, refused by the grid.
    #[error("{0}")]
    Grid(#[source] GridError),
    /// `grid_site_route.prefix_affinity`, refused by the library.
    // The library names `prefix_affinity.*`; the file nests it one level deeper.
    #[error("grid_site_route.{0}")]
    PrefixAffinity(#[source] grid_route_layer::config::PrefixAffinityError),
    /// `grid_site_route.prefix_affinity.tag_key_path` could not be used.
    #[error("grid_site_route.prefix_affinity.tag_key_path: {0}")]
    TagKey(#[source] TagKeyError),
    /// `grid_site_route.prefix_affinity.previous_tag_key_path` could not be used.
    #[error("grid_site_route.prefix_affinity.previous_tag_key_path: {0}")]
    PreviousTagKey(#[source] TagKeyError),
    /// Another field holds a value the gateway cannot use.
    #[error("{field} {expected}, got {value}")]
    Invalid {
        /// The field, as a path in the file (`queue.metric`).
        field: String,
        /// The value it holds, as shown in the message (text quoted).
        value: String,
        /// What it must be.
        expected: String,
    },
}

/// A refused text value: shown quoted.
pub(super) fn invalid(field: impl Into<String>, value: &str, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        value: format!("{value:?}"),
        expected: expected.to_owned(),
    }
}

/// A refused number: shown as is.
pub(super) fn invalid_number(field: &str, value: impl fmt::Display, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        value: value.to_string(),
        expected: expected.to_owned(),
    }
}
