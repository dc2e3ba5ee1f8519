//! The workspace's layout rules, checked: each test helper is defined once (the harness in
//! `tests/src` holds the shared ones), the gateway's files import each other without a
//! cycle, and the gateway does not depend on what only the simulator needs.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use grid_route_tests::workspace_root;

/// The `.rs` files directly in `dir`, relative to the workspace root.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join(dir))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
}

/// The names of the items defined at the top level of the Rust file `path`: `fn`,
/// `struct`, `enum`, `type` and `const`, public or not.
fn top_level_items(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|line| {
            let mut rest = line;
            for prefix in ["pub(crate) ", "pub(super) ", "pub ", "async "] {
                rest = rest.strip_prefix(prefix).unwrap_or(rest);
            }
            let rest = rest.strip_prefix("async ").unwrap_or(rest);
            let (_, name) = ["fn ", "struct ", "enum ", "type ", "const "]
                .iter()
                .find_map(|kind| rest.strip_prefix(kind).map(|name| (kind, name)))?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn no_test_helper_is_defined_in_two_files() {
    let dirs = [
        "tests/src",
        "tests/tests",
        "grid-route-example/tests",
        "grid-route-layer/tests",
        "tests/mock-engine/tests",
        "benches/simulate/tests",
    ];
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for dir in dirs {
        for file in rust_files(dir) {
            let shown = file
                .strip_prefix(workspace_root())
                .unwrap()
                .display()
                .to_string();
            for name in top_level_items(&file) {
                defined.entry(name).or_default().insert(shown.clone());
            }
        }
    }
    let twice: Vec<String> = defined
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {files:?}"))
        .collect();
    assert!(
        twice.is_empty(),
        "helpers defined in more than one file (share them from tests/src, or name \
         what differs):\n{}",
        twice.join("\n")
    );
}

/// The sibling modules of `gateway/` that the module at `path` imports (`super::NAME`, or
/// `super::super::NAME` from the files of a module that is a directory).
fn gateway_imports(path: &Path, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let text = if path.is_dir() {
        rust_files(
            path.strip_prefix(workspace_root())
                .unwrap()
                .to_str()
                .unwrap(),
        )
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
    } else {
        std::fs::read_to_string(path).unwrap()
    };
    let mut imports = BTreeSet::new();
    for (at, _) in text.match_indices("super::") {
        let name: String = text[at + "super::".len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if siblings.contains(&name) {
            imports.insert(name);
        }
    }
    imports
}

/// Whether `target` is reachable from `from` in `graph` (depth first).
fn reaches(
    graph: &BTreeMap<&str, BTreeSet<String>>,
    from: &str,
    target: &str,
    seen: &mut BTreeSet<String>,
) -> bool {
    graph[from].iter().any(|next| {
        next == target || (seen.insert(next.clone()) && reaches(graph, next, target, seen))
    })
}

#[test]
fn the_gateways_files_import_each_other_without_a_cycle() {
    let dir = workspace_root().join("grid-route-example/src/gateway");
    let mut modules: BTreeMap<String, PathBuf> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() || (name != "mod" && path.extension().is_some_and(|e| e == "rs")) {
            modules.insert(name, path);
        }
    }
    assert!(modules.len() > 5, "{modules:?}");
    let siblings: BTreeSet<String> = modules.keys().cloned().collect();
    let graph: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .map(|(name, path)| (name.as_str(), gateway_imports(path, &siblings)))
        .collect();
    for module in graph.keys() {
        assert!(
            !reaches(&graph, module, module, &mut BTreeSet::new()),
            "gateway/{module} imports a module that imports it back: {graph:?}"
        );
    }
}

#[test]
fn the_gateway_does_not_depend_on_the_simulators_plotting() {
    let manifest =
        std::fs::read_to_string(workspace_root().join("grid-route-example/Cargo.toml")).unwrap();
    assert!(!manifest.contains("plotters"), "{manifest}");
    let simulator =
        std::fs::read_to_string(workspace_root().join("benches/simulate/Cargo.toml")).unwrap();
    assert!(simulator.contains("plotters"), "{simulator}");
}
