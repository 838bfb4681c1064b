//! The workspace as `cargo metadata` sees it: members, their targets, the resolved dependency graph.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A kind of dependency edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Build,
    Dev,
}

impl Kind {
    fn of(v: &Value) -> Kind {
        match v["kind"].as_str() {
            Some("build") => Kind::Build,
            Some("dev") => Kind::Dev,
            _ => Kind::Normal,
        }
    }
}

/// A workspace member.
pub struct Member {
    pub name: String,
    /// Its directory, relative to the workspace root (`services/gateway`).
    pub dir: PathBuf,
    /// Root files of its lib, bin and proc-macro targets (tests, benches, examples, build scripts
    /// left out).
    pub roots: Vec<PathBuf>,
}

pub struct Workspace {
    pub root: PathBuf,
    pub members: Vec<Member>,
    /// Package id -> name.
    names: HashMap<String, String>,
    /// Package id -> (dependency id, kinds of the edge).
    deps: HashMap<String, Vec<(String, Vec<Kind>)>>,
}

impl Workspace {
    /// Runs `cargo metadata` on the workspace this crate belongs to.
    pub fn load() -> Workspace {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let out = std::process::Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(&manifest)
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints json");
        let root = PathBuf::from(meta["workspace_root"].as_str().expect("workspace_root"));
        let member_ids: Vec<&str> =
            meta["workspace_members"].as_array().into_iter().flatten().flat_map(Value::as_str).collect();
        let packages = meta["packages"].as_array().expect("packages");
        let names = packages
            .iter()
            .map(|p| (p["id"].as_str().unwrap().to_string(), p["name"].as_str().unwrap().to_string()))
            .collect();
        let members = packages
            .iter()
            .filter(|p| member_ids.contains(&p["id"].as_str().unwrap()))
            .map(|p| {
                let manifest = Path::new(p["manifest_path"].as_str().unwrap());
                let dir = manifest.parent().unwrap().strip_prefix(&root).unwrap().to_path_buf();
                let roots = p["targets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|t| {
                        let kinds = t["kind"].as_array().into_iter().flatten().flat_map(Value::as_str);
                        kinds.into_iter().any(|k| {
                            matches!(k, "lib" | "rlib" | "dylib" | "cdylib" | "staticlib" | "bin" | "proc-macro")
                        })
                    })
                    .map(|t| PathBuf::from(t["src_path"].as_str().unwrap()))
                    .collect();
                Member { name: p["name"].as_str().unwrap().to_string(), dir, roots }
            })
            .collect();
        let deps = meta["resolve"]["nodes"]
            .as_array()
            .expect("resolve")
            .iter()
            .map(|n| {
                let deps = n["deps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        let kinds = d["dep_kinds"].as_array().into_iter().flatten().map(Kind::of).collect();
                        (d["pkg"].as_str().unwrap().to_string(), kinds)
                    })
                    .collect();
                (n["id"].as_str().unwrap().to_string(), deps)
            })
            .collect();
        Workspace { root, members, names, deps }
    }

    /// Members whose directory lies under `dir` (`services`), but those named in `except`.
    pub fn members_under<'a>(&'a self, dir: &str, except: &[&str]) -> Vec<&'a Member> {
        self.members
            .iter()
            .filter(|m| m.dir.starts_with(dir) && !except.iter().any(|e| m.dir == Path::new(dir).join(e)))
            .collect()
    }

    fn id(&self, name: &str) -> &str {
        let mut ids = self.names.iter().filter(|(_, n)| *n == name).map(|(id, _)| id.as_str());
        ids.next().unwrap_or_else(|| panic!("{name} is a package of the workspace"))
    }

    /// Every package `from` reaches that `bad` matches, each with one chain of names leading to it:
    /// the first step over an edge of one of the `first` kinds, every later step over one of `then`.
    pub fn reaches(&self, from: &str, first: &[Kind], then: &[Kind], bad: impl Fn(&str) -> bool) -> Vec<String> {
        let start = self.id(from).to_string();
        let mut parent: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = VecDeque::from([start.clone()]);
        let mut found = Vec::new();
        while let Some(id) = queue.pop_front() {
            let kinds = if id == start { first } else { then };
            for (dep, edge) in self.deps.get(&id).into_iter().flatten() {
                if !edge.iter().any(|k| kinds.contains(k)) || *dep == start || parent.contains_key(dep) {
                    continue;
                }
                parent.insert(dep.clone(), id.clone());
                queue.push_back(dep.clone());
                if bad(&self.names[dep]) {
                    let mut chain = vec![self.names[dep].clone()];
                    let mut at = dep;
                    while let Some(p) = parent.get(at) {
                        chain.push(self.names[p].clone());
                        at = p;
                    }
                    chain.reverse();
                    found.push(chain.join(" -> "));
                }
            }
        }
        found
    }
}
