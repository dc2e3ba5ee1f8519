//! The README's Rust code is compiled: every `rust` block in it must stand, verbatim, in
//! `grid-route-example/examples/own_balancer.rs`, which `cargo test` builds.

const README: &str = include_str!("../../README.md");
const EXAMPLE: &str = include_str!("../../grid-route-example/examples/own_balancer.rs");

#[test]
fn every_rust_block_in_the_readme_is_compiled_example_code() {
    let blocks: Vec<&str> = README
        .split("```rust\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(!blocks.is_empty(), "the README shows the layers in use");
    for block in blocks {
        assert!(
            EXAMPLE.contains(block),
            "this README block is not in examples/own_balancer.rs:\n{block}"
        );
    }
}
