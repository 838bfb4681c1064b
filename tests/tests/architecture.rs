//! Architecture rules as tests (DESIGN.md §5, §8), so CI fails when one breaks:
//! - no module cycle in any target of any workspace crate;
//! - a service crate depends on `shared/*` crates only, never on another service;
//! - `assay-domain` reaches no transport, backend, metrics or runtime crate;
//! - no `shared/*` crate depends on a service crate (the gateway in particular);
//! - `assay-config` depends on no runtime crate;
//! - `assay-domain` touches no file, network, environment, process, thread or clock outside its
//!   tests: its rules are pure functions of their inputs (a time is passed in, never read).
//!
//! The module-cycle checker proves it can fail on a fixture crate with known cycles, and the
//! purity check on a fixture crate that reads a file and the clock.

#[path = "support/cargo_graph.rs"]
mod cargo_graph;
#[path = "support/modgraph.rs"]
mod modgraph;
#[path = "support/modscope.rs"]
mod modscope;

use std::path::Path;

use cargo_graph::{Kind, Workspace};
use modgraph::{Cycle, cycles, render, uses};

/// Composition roots: they wire the services together, so they may depend on them.
const COMPOSITION_ROOTS: &[&str] = &["mesh", "cli"];

/// What `assay-domain` must never reach (besides every service crate): `x*` is `x` or any `x-...`
/// crate. Transport (gRPC, HTTP, their codegen), storage backends, model backends, metrics export,
/// and the shared crates built on those. tokio is not listed: a runtime is not a transport, and the
/// domain does not need it today (a dev-dependency only).
const DOMAIN_DENIED: &[&str] = &[
    "tonic*",
    "prost*",
    "hyper*",
    "h2",
    "http",
    "http-body*",
    "reqwest*",
    "axum*",
    "tower*",
    "sqlx*",
    "rusqlite",
    "libsqlite3-sys",
    "tokio-postgres*",
    "postgres*",
    "deadpool*",
    "llama-cpp*",
    "candle*",
    "tokenizers",
    "opentelemetry*",
    "tracing-opentelemetry",
    "assay-proto",
    "assay-rpc",
    "assay-llm",
    "assay-runtime",
    "assay-embedded",
    "assay-telemetry",
    "assay-testkit",
    "assay-config",
];

/// Runtime crates that the configuration must not depend on (it is read by all of them).
const RUNTIME_CRATES: &[&str] = &["assay-llm", "assay-rpc", "assay-runtime", "assay-embedded"];

fn denied(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(family) => name == family || name.strip_prefix(family).is_some_and(|rest| rest.starts_with('-')),
        None => name == *p,
    })
}

fn fail_if_any(rule: &str, broken: Vec<String>) {
    assert!(broken.is_empty(), "{rule}:\n    {}", broken.join("\n    "));
}

#[test]
fn no_module_cycles() {
    let ws = Workspace::load();
    let mut report = String::new();
    for member in &ws.members {
        for root in &member.roots {
            let found = cycles(root, &ws.root).unwrap_or_else(|e| panic!("{}: {e}", member.name));
            if !found.is_empty() {
                let target = root.strip_prefix(&ws.root).unwrap_or(root);
                report += &format!("{} ({}):\n{}", member.name, target.display(), render(&found));
            }
        }
    }
    assert!(
        report.is_empty(),
        "module cycles (an edge `a -> b: X` is file a using name X of module b; break one edge of \
         each cycle, e.g. by moving what both sides use into a third module; a name marked \
         `(re-export of f)` can be imported from f itself):\n{report}"
    );
}

#[test]
fn services_do_not_depend_on_services() {
    let ws = Workspace::load();
    let services = ws.members_under("services", COMPOSITION_ROOTS);
    let is_service = |name: &str| services.iter().any(|s| s.name == name);
    let mut broken = Vec::new();
    for s in &services {
        // Normal and build dependencies, and what they bring in: what ships in the binary.
        broken.extend(ws.reaches(&s.name, &[Kind::Normal, Kind::Build], &[Kind::Normal, Kind::Build], is_service));
        // Dev-dependencies count too: a service's tests that need another service belong in the
        // tests crate (it wires services together), and a dev-dependency is the one edge cargo
        // lets form a cycle (a -> b -> a), so it would hide exactly the coupling this rule keeps out.
        broken.extend(ws.reaches(&s.name, &[Kind::Dev], &[Kind::Normal, Kind::Build], is_service));
    }
    fail_if_any("a service crate depends on another service crate (only mesh, cli and tests may)", broken);
}

#[test]
fn domain_reaches_no_transport_or_backend() {
    let ws = Workspace::load();
    let services = ws.members_under("services", &[]);
    let bad = |name: &str| denied(DOMAIN_DENIED, name) || services.iter().any(|s| s.name == name);
    let broken = ws.reaches("assay-domain", &[Kind::Normal], &[Kind::Normal], bad);
    fail_if_any("assay-domain reaches a transport, backend or runtime crate", broken);
}

#[test]
fn shared_crates_do_not_depend_on_services() {
    let ws = Workspace::load();
    let services = ws.members_under("services", &[]);
    let is_service = |name: &str| services.iter().any(|s| s.name == name);
    let kinds = [Kind::Normal, Kind::Build];
    let broken =
        ws.members_under("shared", &[]).iter().flat_map(|m| ws.reaches(&m.name, &kinds, &kinds, is_service)).collect();
    fail_if_any("a shared crate depends on a service crate", broken);
}

/// Fails while `assay-config` still depends on `assay-llm` (being removed on another branch).
#[test]
fn config_depends_on_no_runtime_crate() {
    let ws = Workspace::load();
    let kinds = [Kind::Normal, Kind::Build];
    let broken = ws.reaches("assay-config", &kinds, &kinds, |name| RUNTIME_CRATES.contains(&name));
    fail_if_any("assay-config depends on a runtime crate", broken);
}

#[test]
fn deny_patterns_name_crate_families() {
    assert!(denied(DOMAIN_DENIED, "tonic") && denied(DOMAIN_DENIED, "tonic-health"));
    assert!(denied(DOMAIN_DENIED, "llama-cpp-sys-2") && denied(DOMAIN_DENIED, "http"));
    assert!(!denied(DOMAIN_DENIED, "tonicx") && !denied(DOMAIN_DENIED, "httparse"));
    assert!(!denied(DOMAIN_DENIED, "serde") && !denied(DOMAIN_DENIED, "assay-domain"));
}

/// Paths whose use is the outside world: files, network, environment, processes, threads, and
/// reading a clock (`x::` is the module `x` and anything in it; a name alone is that item).
const IMPURE: &[&str] = &[
    "std::fs::",
    "std::net::",
    "std::env::",
    "std::process::",
    "std::thread::",
    "std::io::stdin",
    "std::io::stdout",
    "std::io::stderr",
    "std::time::Instant::now",
    "std::time::SystemTime::now",
    "std::time::SystemTime::UNIX_EPOCH",
    "chrono::Utc::now",
    "chrono::Local::now",
    "tokio::",
    "rand::rng",
    "rand::thread_rng",
];

/// The outside-world uses of the target rooted at `root` (see [`IMPURE`]), as `file: path`.
fn impure_uses(root: &Path, base: &Path) -> Vec<String> {
    let found = uses(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let mut broken: Vec<String> = found
        .into_iter()
        .filter_map(|(file, segs)| {
            let path = segs.join("::");
            let hit = IMPURE.iter().any(|p| match p.strip_suffix("::") {
                Some(module) => path == module || path.starts_with(&format!("{module}::")),
                None => path == *p,
            });
            hit.then(|| format!("{}: {path}", file.strip_prefix(base).unwrap_or(&file).display()))
        })
        .collect();
    broken.sort();
    broken.dedup();
    broken
}

#[test]
fn domain_touches_no_file_network_environment_or_clock() {
    let ws = Workspace::load();
    let domain = ws.members.iter().find(|m| m.name == "assay-domain").expect("assay-domain is a member");
    let lib = domain.roots.iter().find(|r| r.ends_with("src/lib.rs")).expect("assay-domain's lib.rs");
    fail_if_any(
        "assay-domain uses the outside world outside its tests (pass what it needs in: a time, a text)",
        impure_uses(lib, &ws.root),
    );
}

#[test]
fn the_purity_check_finds_the_fixture_impurities() {
    let base = fixture("impure");
    let found = impure_uses(&base.join("src/lib.rs"), &base);
    assert_eq!(
        found,
        [
            "src/clock.rs: std::time::Instant::now",
            "src/lib.rs: std::env::var",
            "src/lib.rs: std::fs",
            "src/lib.rs: std::fs::read_to_string",
        ],
        "{found:?}"
    );
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/architecture").join(name)
}

#[test]
fn the_cycle_checker_finds_the_fixture_cycles() {
    let base = fixture("cycle");
    let found = cycles(&base.join("src/lib.rs"), &base).unwrap();
    let edge = |a: &str, b: &str, names: &[&str]| (a.into(), b.into(), names.iter().map(|n| n.to_string()).collect());
    let expected = vec![
        Cycle {
            files: vec!["src/a.rs".into(), "src/b.rs".into()],
            edges: vec![edge("src/a.rs", "src/b.rs", &["X", "helper"]), edge("src/b.rs", "src/a.rs", &["Y"])],
        },
        Cycle {
            files: vec!["src/parent/child.rs".into(), "src/parent/mod.rs".into()],
            edges: vec![
                edge("src/parent/child.rs", "src/parent/mod.rs", &["Shared"]),
                edge("src/parent/mod.rs", "src/parent/child.rs", &["Leaf", "make"]),
            ],
        },
    ];
    assert_eq!(found, expected, "{}", render(&found));
    let report = render(&found);
    assert!(report.contains("src/a.rs -> src/b.rs: X, helper"), "{report}");
}

#[test]
fn the_cycle_checker_passes_an_acyclic_crate() {
    let base = fixture("acyclic");
    let found = cycles(&base.join("src/lib.rs"), &base).unwrap();
    assert!(found.is_empty(), "{}", render(&found));
}
