//! The workspace's `rust-version` is the lowest toolchain its locked
//! dependencies allow: the highest `rust-version` among them, no more (a
//! user with that toolchain can build it) and no less (a dependency
//! updated in `Cargo.lock` that needs a newer one fails here, not on a
//! user's machine). The project's own code is held to it by clippy's
//! `incompatible_msrv` lint (`cargo clippy -- -D warnings`).

use std::path::Path;
use std::process::Command;

/// A `rust-version` as numbers ("1.88" and "1.88.0" are equal).
fn version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().expect(v)).collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn rust_version_is_what_the_locked_dependencies_need() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // The resolve includes other platforms' dependencies (Windows consoles,
    // say), which a Linux build never fetches: scripts/test runs
    // `cargo fetch --locked` first.
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata --offline failed (run `cargo fetch --locked` first; scripts/test does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let packages = meta["packages"].as_array().expect("packages");
    let ours: Vec<&str> = packages
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap_or_default()))
        .map(|p| {
            p["rust_version"]
                .as_str()
                .expect("every crate states rust-version")
        })
        .collect();
    let needed = packages
        .iter()
        .filter(|p| !members.contains(&p["id"].as_str().unwrap_or_default()))
        .filter_map(|p| {
            let v = p["rust_version"].as_str()?;
            Some((
                version(v),
                format!("{} {} needs {v}", p["name"], p["version"]),
            ))
        })
        .max()
        .expect("dependencies state rust-version");
    for v in ours {
        assert_eq!(
            version(v),
            needed.0,
            "rust-version {v} is not the lowest the locked dependencies allow ({})",
            needed.1
        );
    }
}
