//! The grid: sites, their backend clusters, and the names that identify them.
//!
//! A *site* is a named place (a data centre, a region, a pool); a *cluster* is a group of
//! inference engines at one site. Cluster names are turned into an 8-hex-digit
//! [`ClusterDigest`] so that tagged ids can name a cluster without spelling out its name.
//!
//! ```
//! use grid_route_layer::grid::{ClusterDigest, SiteName};
//!
//! let site = SiteName::new("east").unwrap();
//! let digest = ClusterDigest::of_name("east-a");
//! assert_eq!(digest.to_string().len(), 8);
//! assert!(SiteName::new("East_1").is_err());
//! # let _ = site;
//! ```

mod names;

pub use names::{ClusterDigest, ClusterId, InvalidName, SiteName};
