//! Criterion benchmarks for grid-route live in `benches/`; this library holds shared inputs.
