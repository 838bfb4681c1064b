//! The module graph of one crate target, read with `syn`, and its cycles.
//!
//! Nodes are source files: a module's file (an inline `mod x { }` belongs to its file). An edge
//! A -> B means file A uses a name from module B, through a `use` tree or a path in code
//! (`crate::a::X`, `super::x::Y`, `self::x`, `child::Y` for a module declared here, or a name a
//! `use` made an alias of a module, e.g. `use crate::engine;` then `engine::ctx::now`). A path
//! resolves to its longest prefix that is a known module, and the edge goes to the file that
//! defines the name, following re-exports: `crate::RunCtx`, re-exported by `lib.rs` from
//! `ctx/mod.rs`, is an edge to `ctx/mod.rs` (a facade is a way through, not a dependency; a
//! `pub use` of a child's name is an edge of the re-exporting file to the child). Naming a module
//! itself (`mod x;`, `use crate::x;`, `use x::{self}`) is no edge: only what is used through it.
//!
//! Skipped: `#[cfg(test)]` items, paths of other crates (and `::x`), macro bodies that are not
//! comma-separated expressions. A `use` inside a block counts as one of its module.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use petgraph::graph::DiGraph;
use syn::Item;

use crate::modscope::{Module, path_attr, scan};

/// One strongly connected set of files and the edges between them, with the names behind each.
#[derive(Debug, PartialEq, Eq)]
pub struct Cycle {
    pub files: Vec<PathBuf>,
    pub edges: Vec<(PathBuf, PathBuf, Vec<String>)>,
}

#[derive(Default)]
struct Crate {
    modules: Vec<Module>,
    by_path: HashMap<Vec<String>, usize>,
}

/// Adds module `path`, in `file` (inline when `inline`), with `items`, and its modules in turn;
/// `dir` is where its `mod x;` files are (and its `#[path]`s, inside an inline module).
fn walk(
    krate: &mut Crate,
    path: Vec<String>,
    file: &Path,
    items: &[Item],
    dir: &Path,
    inline: bool,
) -> Result<(), String> {
    let at = krate.modules.len();
    krate.by_path.insert(path.clone(), at);
    krate.modules.push(Module { path: path.clone(), file: file.to_path_buf(), ..Module::default() });
    let file_dir = file.parent().unwrap_or(Path::new("."));
    let nested = scan(&mut krate.modules[at], items);
    for m in nested {
        let name = m.ident.to_string();
        let mut child = path.clone();
        child.push(name.clone());
        let explicit = path_attr(&m.attrs);
        if let Some((_, items)) = &m.content {
            let sub = explicit.map_or_else(|| dir.join(&name), |p| dir.join(p));
            walk(krate, child, file, items, &sub, true)?;
            continue;
        }
        let child_file = match explicit {
            Some(p) if inline => dir.join(p),
            Some(p) => file_dir.join(p),
            None if dir.join(format!("{name}.rs")).is_file() => dir.join(format!("{name}.rs")),
            None => dir.join(&name).join("mod.rs"),
        };
        let src = std::fs::read_to_string(&child_file).map_err(|e| format!("{}: {e}", child_file.display()))?;
        let parsed = syn::parse_file(&src).map_err(|e| format!("{}: {e}", child_file.display()))?;
        // `x.rs` and `x/mod.rs` keep their modules in `x/`; a `#[path]` file, next to itself.
        let sub = match path_attr(&m.attrs) {
            Some(_) => child_file.parent().unwrap_or(Path::new(".")).to_path_buf(),
            None => dir.join(&name),
        };
        walk(krate, child, &child_file, &parsed.items, &sub, false)?;
    }
    Ok(())
}

impl Crate {
    /// Parses the target whose root file is `root` (lib.rs, main.rs, bin/x.rs).
    fn load(root: &Path) -> Result<Crate, String> {
        let src = std::fs::read_to_string(root).map_err(|e| format!("{}: {e}", root.display()))?;
        let parsed = syn::parse_file(&src).map_err(|e| format!("{}: {e}", root.display()))?;
        let mut krate = Crate::default();
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        walk(&mut krate, Vec::new(), root, &parsed.items, &dir, false)?;
        Ok(krate)
    }

    /// The crate-absolute path that `segs`, written in module `m`, names; `None` for another
    /// crate's path, a local name or `Self`.
    fn resolve(&self, m: usize, segs: &[String], depth: u8) -> Option<Vec<String>> {
        let module = &self.modules[m];
        let (first, rest) = segs.split_first()?;
        if depth > 8 {
            return None;
        }
        let mut abs = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.path.clone(),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                let keep = module.path.len().checked_sub(ups)?;
                let mut abs = module.path[..keep].to_vec();
                abs.extend_from_slice(&segs[ups..]);
                return Some(abs);
            }
            _ if module.children.contains(first) => [module.path.clone(), vec![first.clone()]].concat(),
            _ => match module.aliases.get(first).filter(|target| target.as_slice() != segs) {
                Some(target) => self.resolve(m, target, depth + 1)?,
                None => return self.through_globs(m, segs, depth),
            },
        };
        abs.extend_from_slice(rest);
        Some(abs)
    }

    /// `segs` resolved in a module that a `use m::*` of module `m` imports everything from.
    fn through_globs(&self, m: usize, segs: &[String], depth: u8) -> Option<Vec<String>> {
        let module = &self.modules[m];
        module.globs.iter().find_map(|g| {
            let from = *self.by_path.get(&self.resolve(m, g, depth + 1)?)?;
            let target = &self.modules[from];
            let known = target.children.contains(&segs[0]) || target.aliases.contains_key(&segs[0]);
            if known { self.resolve(from, segs, depth + 1) } else { None }
        })
    }

    /// The module of the longest prefix of `abs` that is one, and the name after it (`None` when
    /// `abs` is a module).
    fn locate<'a>(&self, abs: &'a [String]) -> Option<(usize, Option<&'a String>)> {
        let len = (0..=abs.len()).rev().find(|n| self.by_path.contains_key(&abs[..*n]))?;
        Some((self.by_path[&abs[..len]], abs.get(len)))
    }

    /// The file that defines `name` of module `m`, following `use` re-exports (and globs) from
    /// module to module.
    fn home(&self, mut m: usize, name: &str) -> &Path {
        let mut name = name.to_string();
        for _ in 0..8 {
            let module = &self.modules[m];
            if module.items.contains(&name) || module.children.contains(&name) {
                break;
            }
            let via_glob = || {
                module.globs.iter().find_map(|g| {
                    let from = &self.modules[*self.by_path.get(&self.resolve(m, g, 0)?)?];
                    let known = from.items.contains(&name) || from.aliases.contains_key(&name);
                    known.then(|| [g.clone(), vec![name.clone()]].concat())
                })
            };
            let written = module.aliases.get(&name).cloned().or_else(via_glob);
            let Some(abs) = written.and_then(|w| self.resolve(m, &w, 0)) else { break };
            let Some((next, Some(next_name))) = self.locate(&abs) else { break };
            (m, name) = (next, next_name.clone());
        }
        &self.modules[m].file
    }

    /// File edges (from, to) -> the names used, each with the file that defines it; own-file
    /// uses left out.
    fn edges(&self) -> BTreeMap<(PathBuf, PathBuf), BTreeSet<(String, PathBuf)>> {
        let mut edges: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        for (m, module) in self.modules.iter().enumerate() {
            for segs in &module.used {
                let Some(abs) = self.resolve(m, segs, 0) else { continue };
                // A module named by itself is no use of it.
                let Some((target, Some(name))) = self.locate(&abs) else { continue };
                // The edge goes to the file that defines the name: a facade that only re-exports
                // it (`pub use usage::Usage` in lib.rs) is a way through, not a dependency.
                let home = self.home(target, name).to_path_buf();
                if home != module.file {
                    edges.entry((module.file.clone(), home.clone())).or_default().insert((name.clone(), home));
                }
            }
        }
        edges
    }
}

/// Every path the target rooted at `root` uses outside tests, as `(file, path)`, with a first
/// segment that a `use` made an alias resolved to what it names (`use std::fs; fs::read` is
/// `std::fs::read`; `use std::time::Instant; Instant::now` is `std::time::Instant::now`).
pub fn uses(root: &Path) -> Result<Vec<(PathBuf, Vec<String>)>, String> {
    let krate = Crate::load(root)?;
    let mut found = Vec::new();
    for module in &krate.modules {
        for segs in &module.used {
            let Some(first) = segs.first() else { continue };
            let full = match module.aliases.get(first) {
                Some(named) if named != segs => [named.clone(), segs[1..].to_vec()].concat(),
                _ => segs.clone(),
            };
            found.push((module.file.clone(), full));
        }
    }
    Ok(found)
}

/// The module cycles of the target rooted at `root`, with file paths relative to `base`.
pub fn cycles(root: &Path, base: &Path) -> Result<Vec<Cycle>, String> {
    let edges = Crate::load(root)?.edges();
    let rel = |p: &Path| p.strip_prefix(base).unwrap_or(p).to_path_buf();
    let mut graph = DiGraph::<PathBuf, ()>::new();
    let mut nodes = HashMap::new();
    for (from, to) in edges.keys() {
        let a = *nodes.entry(from.clone()).or_insert_with(|| graph.add_node(from.clone()));
        let b = *nodes.entry(to.clone()).or_insert_with(|| graph.add_node(to.clone()));
        graph.add_edge(a, b, ());
    }
    let mut found: Vec<Cycle> = petgraph::algo::tarjan_scc(&graph)
        .into_iter()
        .filter(|scc| scc.len() > 1)
        .map(|scc| {
            let files: BTreeSet<&PathBuf> = scc.iter().map(|n| &graph[*n]).collect();
            let edges = edges
                .iter()
                .filter(|((a, b), _)| files.contains(a) && files.contains(b))
                .map(|((a, b), names)| {
                    let names = names.iter().map(|(name, home)| {
                        if home == b { name.clone() } else { format!("{name} (re-export of {})", rel(home).display()) }
                    });
                    (rel(a), rel(b), names.collect())
                })
                .collect();
            Cycle { files: files.into_iter().map(|f| rel(f)).collect(), edges }
        })
        .collect();
    found.sort_by(|a, b| a.files.cmp(&b.files));
    Ok(found)
}

/// The cycles as a report: each cycle's files, then every edge between them with its names.
pub fn render(cycles: &[Cycle]) -> String {
    let mut out = String::new();
    for (i, c) in cycles.iter().enumerate() {
        let files: Vec<_> = c.files.iter().map(|f| f.display().to_string()).collect();
        out += &format!("cycle {}: {}\n", i + 1, files.join(", "));
        for (a, b, names) in &c.edges {
            out += &format!("    {} -> {}: {}\n", a.display(), b.display(), names.join(", "));
        }
    }
    out
}
