//! Every crate's files import one another one way only: no two files import
//! each other, directly or around a loop (a circle hides which part rests on
//! which, and every change then passes through all of it). In the store,
//! the rooms are kept too: the shared ground imports no backend, and a
//! backend imports no other backend and not the crate's front.
//!
//! Read from the source as text: every `crate::PATH` outside a comment is an
//! import of the file of the longest module PATH names (`crate::runtime::
//! link::Link` is `runtime/link.rs`), and of the crate's root file when it
//! names none (`crate::Size`: an item of `main.rs` or `lib.rs`, or one they
//! re-export). `super::PATH` counts where PATH names a sibling
//! (`super::sources::Layers` in `settings/keys.rs` is
//! `settings/sources.rs`); a child reaching up to its own parent's items
//! (`super::Loop`) is not counted: the parent is the folder's front, and its
//! pieces extend it. The test names the first circle it finds, and every
//! import that crosses the store's rooms the wrong way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The paths `text` names after `prefix` (`crate::` or `super::`),
/// outside comments.
fn imports(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            // `crate::` inside `leaderd_crate::` is not one.
            let whole = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
            rest = &rest[at + prefix.len()..];
            if !whole {
                continue;
            }
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':');
            if !path.is_empty() {
                out.insert(path.to_owned());
            }
        }
    }
    out
}

/// The module a file under `src` is: `runtime/link.rs` is `runtime::link`,
/// `runtime/mod.rs` is `runtime`.
fn module_of(relative: &Path) -> String {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The file of the longest module among `modules` that `path` starts with.
fn resolve<'a>(path: &str, modules: &'a BTreeSet<String>) -> Option<&'a String> {
    modules
        .iter()
        .filter(|m| path == m.as_str() || path.starts_with(&format!("{m}::")))
        .max_by_key(|m| m.len())
}

/// The crate's root file among `modules`: `lib`, else `main`.
fn root(modules: &BTreeSet<String>) -> Option<&String> {
    modules
        .iter()
        .find(|m| *m == "lib")
        .or_else(|| modules.iter().find(|m| *m == "main"))
}

/// The file graph of one crate's `src`: module -> modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(String, String)> = sources(src)
        .into_iter()
        .map(|file| {
            let module = module_of(file.strip_prefix(src).expect("under src"));
            let text = std::fs::read_to_string(&file).expect("read a source file");
            (module, text)
        })
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &files {
        let edges = graph.entry(module.clone()).or_default();
        for path in imports(text, "crate::") {
            if let Some(target) = resolve(&path, &modules).or_else(|| root(&modules)) {
                if target != module {
                    edges.insert(target.clone());
                }
            }
        }
        // `super::` of `a::b::c` is `a::b`; only its siblings count.
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        for path in imports(text, "super::") {
            let full = if parent.is_empty() {
                path
            } else {
                format!("{parent}::{path}")
            };
            if let Some(target) = resolve(&full, &modules) {
                if target != module && target.len() > parent.len() {
                    edges.insert(target.clone());
                }
            }
        }
    }
    graph
}

/// Every crate's `src` in the workspace, by the crate's folder name.
fn crates() -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .expect("read crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .map(|p| {
            let name = p
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (name, p.join("src"))
        })
        .collect();
    out.sort();
    out
}

/// The store's room of a module: its folder, `shared` (the ground every
/// backend rests on) or a backend's; `front` for the files at the top (the
/// crate's public face, which picks a backend).
fn room<'a>(module: &'a str, graph: &BTreeMap<String, BTreeSet<String>>) -> &'a str {
    let folder = module.split("::").next().unwrap_or_default();
    let is_folder = graph.keys().any(|m| m.starts_with(&format!("{folder}::")));
    if is_folder {
        folder
    } else {
        "front"
    }
}

/// The imports that cross the store's rooms the wrong way: the front may
/// import any room, a backend only itself and `shared`, `shared` only
/// itself.
fn against_the_rooms(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            let (a, b) = (room(from, graph), room(to, graph));
            let allowed = a == b || a == "front" || (a != "shared" && b == "shared");
            if !allowed {
                wrong.push(format!("{from} ({a}) imports {to} ({b})"));
            }
        }
    }
    wrong
}

/// A circle through the graph, if there is one, as the modules in order.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|n| n == node).unwrap_or(0);
                let mut found = path[from..].to_vec();
                found.push(node.to_owned());
                return Some(found);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, marks, path) {
                return Some(found);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(found) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(found);
        }
    }
    None
}

#[test]
fn no_two_files_import_each_other() {
    let crates = crates();
    let names: Vec<&str> = crates.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["leaderd", "leaderd-bench", "leaderd-core", "leaderd-store"]
    );
    for (name, src) in &crates {
        let graph = graph(src);
        assert!(graph.len() > 5, "{name}: {graph:?}");
        if let Some(found) = circle(&graph) {
            panic!("an import circle in {name}: {}", found.join(" -> "));
        }
    }
}

#[test]
fn the_stores_rooms_import_downward() {
    let (_, src) = crates()
        .into_iter()
        .find(|(n, _)| n == "leaderd-store")
        .expect("the store crate");
    let graph = graph(&src);
    let rooms: BTreeSet<&str> = graph.keys().map(|m| room(m, &graph)).collect();
    assert_eq!(
        rooms,
        BTreeSet::from(["front", "mysql", "postgres", "shared", "sqlite"])
    );
    // The backends do use the ground, so the rule has something to check.
    assert!(
        graph["postgres::store"].contains("shared::error"),
        "{graph:?}"
    );
    let wrong = against_the_rooms(&graph);
    assert!(
        wrong.is_empty(),
        "imports against the store's rooms:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_circle_is_found() {
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.insert("a".into(), set(&["b"]));
    g.insert("b".into(), set(&["c"]));
    g.insert("c".into(), set(&[]));
    assert_eq!(circle(&g), None);
    g.insert("c".into(), set(&["a"]));
    assert_eq!(circle(&g).unwrap(), ["a", "b", "c", "a"]);
    // Comments do not import; code does, wherever on the line; a path
    // names the file of its longest module.
    let text = "//! see crate::x\nuse crate::y::Z; // crate::w\nlet v = crate::u::v::f();";
    assert_eq!(imports(text, "crate::"), set(&["u::v::f", "y::Z"]));
    let text = "use super::{Loop, X};\nuse super::keys::f;\nlet c = not_crate::a::b();";
    assert_eq!(imports(text, "super::"), set(&["keys::f"]));
    assert_eq!(imports(text, "crate::"), set(&[]));
    let modules = set(&["u", "u::v", "y"]);
    assert_eq!(resolve("u::v::f", &modules).unwrap(), "u::v");
    assert_eq!(resolve("y::Z", &modules).unwrap(), "y");
    assert_eq!(module_of(Path::new("runtime/mod.rs")), "runtime");
    assert_eq!(module_of(Path::new("runtime/link.rs")), "runtime::link");
    assert_eq!(root(&set(&["a", "lib", "main"])).unwrap(), "lib");
    assert_eq!(root(&set(&["a", "main"])).unwrap(), "main");
    // Rooms: down from the front, into the ground, never across or up.
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.insert("lib".into(), set(&["pg::store", "shared::url"]));
    g.insert("pg::store".into(), set(&["pg::plan", "shared::url"]));
    g.insert("pg::plan".into(), set(&[]));
    g.insert("shared::url".into(), set(&["shared::tls"]));
    assert!(against_the_rooms(&g).is_empty());
    g.insert("shared::tls".into(), set(&["pg::plan"]));
    g.insert("my::store".into(), set(&["pg::plan", "lib"]));
    assert_eq!(
        against_the_rooms(&g),
        [
            "my::store (my) imports lib (front)",
            "my::store (my) imports pg::plan (pg)",
            "shared::tls (shared) imports pg::plan (pg)",
        ]
    );
}
