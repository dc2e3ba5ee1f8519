//! Integration tests for grid-route live in `tests/`; this library holds their shared
//! helpers.

pub mod counting_alloc;
