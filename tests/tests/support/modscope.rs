//! What one module's scope holds, read from its items with `syn`: child modules, defined names,
//! `use` aliases and globs, and every path its code uses. Test-only items (`#[cfg(test)]`,
//! `#[cfg(all(test, ..))]`) are left out.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Item, ItemMod, UseTree};

/// A module: its path from the crate root, its file, and what its scope knows.
#[derive(Default)]
pub struct Module {
    pub path: Vec<String>,
    pub file: PathBuf,
    pub children: BTreeSet<String>,
    /// Names of the items defined here (types, functions, constants, traits, macros).
    pub items: BTreeSet<String>,
    /// Name brought in by a `use` -> the path it names, as written.
    pub aliases: HashMap<String, Vec<String>>,
    /// Prefixes of `use p::*`, as written.
    pub globs: Vec<Vec<String>>,
    /// Every path used (`use` leaves, paths in code), as written; `*` ends a glob.
    pub used: Vec<Vec<String>>,
}

/// Whether `#[cfg(...)]` attributes make an item exist only in tests.
fn test_only(attrs: &[Attribute]) -> bool {
    fn pred(m: &syn::Meta) -> bool {
        match m {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) => {
                let args = l.parse_args_with(Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated);
                let args: Vec<_> = args.map(|a| a.into_iter().collect()).unwrap_or_default();
                (l.path.is_ident("all") && args.iter().any(pred))
                    || (l.path.is_ident("any") && !args.is_empty() && args.iter().all(pred))
            }
            syn::Meta::NameValue(_) => false,
        }
    }
    attrs.iter().filter(|a| a.path().is_ident("cfg")).any(|a| a.parse_args::<syn::Meta>().is_ok_and(|m| pred(&m)))
}

/// The `#[path = "..."]` of a module declaration.
pub fn path_attr(attrs: &[Attribute]) -> Option<String> {
    let attr = attrs.iter().find(|a| a.path().is_ident("path"))?;
    let syn::Meta::NameValue(nv) = &attr.meta else { return None };
    let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value else { return None };
    Some(s.value())
}

/// The leaves of a `use` tree: (path as written, name it brings in; `None` for a glob or `_`).
fn use_leaves(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let leaf = |prefix: &[String], last: String, name: Option<String>| {
        let mut p = prefix.to_vec();
        if last != "self" {
            p.push(last);
        }
        (p, name)
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let last = n.ident.to_string();
            let name = if last == "self" { prefix.last().cloned() } else { Some(last.clone()) };
            out.push(leaf(prefix, last, name));
        }
        UseTree::Rename(r) => {
            let name = Some(r.rename.to_string()).filter(|n| n != "_");
            out.push(leaf(prefix, r.ident.to_string(), name));
        }
        UseTree::Glob(_) => out.push(leaf(prefix, "*".into(), None)),
        UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, prefix, out)),
    }
}

/// Collects the paths of code (and block-local `use`s) into a module, skipping test-only parts.
struct Paths<'m>(&'m mut Module);

impl Paths<'_> {
    fn add_use(&mut self, u: &syn::ItemUse) {
        if u.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for (path, name) in leaves {
            match (name, path.last().map(String::as_str)) {
                (_, Some("*")) => self.0.globs.push(path[..path.len() - 1].to_vec()),
                (Some(name), _) => drop(self.0.aliases.insert(name, path.clone())),
                (None, _) => {}
            }
            self.0.used.push(path);
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, i: &'ast Item) {
        if test_only(item_attrs(i)) {
            return;
        }
        if let Item::Use(u) = i {
            self.add_use(u);
        } else if let Item::Mod(_) = i {
            // File modules are walked by `walk`, inline ones are scopes of their own.
        } else {
            visit::visit_item(self, i);
        }
    }
    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs = match i {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(_) | syn::ImplItem::Verbatim(_) | _ => return visit::visit_impl_item(self, i),
        };
        if !test_only(attrs) {
            visit::visit_impl_item(self, i);
        }
    }
    fn visit_field(&mut self, f: &'ast syn::Field) {
        if !test_only(&f.attrs) {
            visit::visit_field(self, f);
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            self.0.used.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        visit::visit_macro(self, m);
        let exprs = m.parse_body_with(Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated);
        for e in exprs.iter().flatten() {
            self.visit_expr(e);
        }
    }
}

fn item_attrs(i: &Item) -> &[Attribute] {
    match i {
        Item::Const(x) => &x.attrs,
        Item::Enum(x) => &x.attrs,
        Item::ExternCrate(x) => &x.attrs,
        Item::Fn(x) => &x.attrs,
        Item::ForeignMod(x) => &x.attrs,
        Item::Impl(x) => &x.attrs,
        Item::Macro(x) => &x.attrs,
        Item::Mod(x) => &x.attrs,
        Item::Static(x) => &x.attrs,
        Item::Struct(x) => &x.attrs,
        Item::Trait(x) => &x.attrs,
        Item::TraitAlias(x) => &x.attrs,
        Item::Type(x) => &x.attrs,
        Item::Union(x) => &x.attrs,
        Item::Use(x) => &x.attrs,
        Item::Verbatim(_) | _ => &[],
    }
}

fn item_name(i: &Item) -> Option<String> {
    let ident = match i {
        Item::Const(x) => &x.ident,
        Item::Enum(x) => &x.ident,
        Item::Fn(x) => &x.sig.ident,
        Item::Macro(x) => x.ident.as_ref()?,
        Item::Static(x) => &x.ident,
        Item::Struct(x) => &x.ident,
        Item::Trait(x) => &x.ident,
        Item::TraitAlias(x) => &x.ident,
        Item::Type(x) => &x.ident,
        Item::Union(x) => &x.ident,
        Item::ExternCrate(_)
        | Item::ForeignMod(_)
        | Item::Impl(_)
        | Item::Mod(_)
        | Item::Use(_)
        | Item::Verbatim(_)
        | _ => {
            return None;
        }
    };
    Some(ident.to_string())
}

/// Reads `items` into `module`; returns its test-free `mod` declarations, to walk next.
pub fn scan<'a>(module: &mut Module, items: &'a [Item]) -> Vec<&'a ItemMod> {
    let mut nested = Vec::new();
    for item in items.iter().filter(|i| !test_only(item_attrs(i))) {
        if let Item::Mod(m) = item {
            module.children.insert(m.ident.to_string());
            nested.push(m);
        } else {
            module.items.extend(item_name(item));
            Paths(module).visit_item(item);
        }
    }
    nested
}
