//! The shape of the library's source tree, read from `src/`: its layers, its module graph, and the
//! size of its files and functions.
//!
//! The layers, top to bottom (see `ARCHITECTURE.md`): `blocking` and `testing`, `inspect`, `primitives`,
//! `engine`, `redis`, `util`, and the vocabulary every layer shares (`config`, `error`). A module
//! may use its own layer and the ones below, never one above, and no set of modules uses itself in
//! a circle. The binary (`src/bin`) is a crate of its own over the public API: only its sizes are
//! checked.
//!
//! Uses are read from the source as written: `crate::` and `super::` paths, grouped or not, outside
//! comments and string literals. Re-exports (`pub use`, `pub(crate) use`) make no edge: a folder's
//! `mod.rs` that names what its files define depends on nothing by that.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers from the bottom up; a module's layer is its path's first component.
const LAYERS: &[&[&str]] = &[
    &["config", "error"],
    &["util"],
    &["redis"],
    &["engine"],
    &["primitives"],
    &["inspect"],
    &["blocking", "testing"],
];

/// Longest file, in lines, that the tree allows ("about 600"; a file over it says why at the top).
const FILE_LINES: usize = 620;
/// Longest function, in lines, from its `fn` line to its closing brace.
const FN_LINES: usize = 80;
/// The marker a file or function carries, with its reason, to be allowed to be longer.
const ONE_PIECE: &str = "One piece:";

struct Source {
    /// The module path, as `engine::core::handoff` (`lib` for the crate root).
    module: Vec<String>,
    path: PathBuf,
    text: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension() != Some("rs".as_ref()) {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).expect("a source file is readable");
            out.push(Source { module, path, text });
        }
    }
    out.sort_by(|a, b| a.module.cmp(&b.module));
    assert!(out.len() > 20, "found the sources in {}", root.display());
    out
}

/// `text` with comments, string and char literals blanked (line breaks kept, so that line numbers
/// stay right).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(rest.len(), |e| e + 4);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"r#\"") || rest.starts_with(b"r\"") {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let open = 2 + hashes;
            let end = text[i + open..]
                .find(&close)
                .map_or(rest.len(), |e| open + e + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, &rest[..(j + 1).min(rest.len())]);
            i += j + 1;
        } else if rest[0] == b'\'' && char_literal_len(rest).is_some() {
            let n = char_literal_len(rest).unwrap();
            blank(&mut out, &rest[..n]);
            i += n;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of a char literal at the start of `s` (`'x'`, `'\n'`, `'\u{..}'`), or `None` for a
/// lifetime.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.get(1) == Some(&b'\\') {
        let end = s[2..].iter().position(|&c| c == b'\'')?;
        return Some(end + 3);
    }
    let text = std::str::from_utf8(&s[1..s.len().min(6)])
        .unwrap_or_else(|e| std::str::from_utf8(&s[1..1 + e.valid_up_to()]).unwrap());
    let c = text.chars().next()?;
    (text[c.len_utf8()..].starts_with('\'')).then_some(c.len_utf8() + 2)
}

/// The paths a source uses, absolute from the crate root, outside re-exports.
fn uses(source: &Source, code: &str) -> BTreeSet<Vec<String>> {
    let mut paths = BTreeSet::new();
    let bytes = code.as_bytes();
    for (start, prefix) in [("crate::", None), ("super::", Some(()))] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start).map(|p| p + from) {
            from = at + start.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':')
            {
                continue;
            }
            if reexport(code, at) {
                continue;
            }
            let base: Vec<String> = match prefix {
                None => Vec::new(),
                Some(()) => {
                    let mut base = source.module.clone();
                    // A `mod.rs` is its folder's module; a file's `super` is its parent.
                    base.pop();
                    let mut rest = &code[from..];
                    while let Some(r) = rest.strip_prefix("super::") {
                        base.pop();
                        rest = r;
                        from += "super::".len();
                    }
                    base
                }
            };
            for path in expand(&code[from..]) {
                let mut full = base.clone();
                full.extend(path);
                paths.insert(full);
            }
        }
    }
    paths
}

/// Whether the statement holding position `at` is a re-export.
fn reexport(code: &str, at: usize) -> bool {
    let start = code[..at].rfind([';', '{', '}']).map_or(0, |p| p + 1);
    let stmt = code[start..at].trim_start();
    stmt.starts_with("pub use") || stmt.starts_with("pub(crate) use") || stmt.starts_with("pub(super) use")
}

/// The paths of a use tree at the start of `s` (`a::b`, `a::{b, c::d}`, `{a, b}`).
fn expand(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(inner) = s.strip_prefix('{') {
        let mut depth = 1;
        let mut end = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let inner = &inner[..end];
        let mut items = Vec::new();
        let (mut depth, mut last) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[last..i]);
                    last = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[last..]);
        return items
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(expand)
            .collect();
    }
    let mut path = Vec::new();
    let mut rest = s;
    loop {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        path.push(name);
        match rest.strip_prefix("::") {
            Some(r) if r.trim_start().starts_with('{') => {
                return expand(r)
                    .into_iter()
                    .map(|tail| [path.clone(), tail].concat())
                    .collect();
            }
            Some(r) => rest = r,
            None => break,
        }
    }
    vec![path]
}

/// What the crate root re-exports, by name: `Error` is `error::Error`.
fn root_exports(lib: &str) -> BTreeMap<String, Vec<String>> {
    let mut map = BTreeMap::new();
    let code = code_only(lib);
    for stmt in code.split(';') {
        let Some(tree) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        for path in expand(tree) {
            if let Some(last) = path.last() {
                map.insert(last.clone(), path.clone());
            }
        }
    }
    map
}

fn layer(module: &[String]) -> Option<usize> {
    let first = module.first()?;
    LAYERS.iter().position(|names| names.contains(&first.as_str()))
}

/// The module graph: for each module (a layer's file or folder, as `engine::core`), the modules
/// of the crate it uses. A folder's files are one module with it, as a file's `impl` blocks are.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let sources = sources();
    let lib = sources.iter().find(|s| s.module == ["lib"]).expect("src/lib.rs");
    let exports = root_exports(&lib.text);
    let node = |module: &[String]| module.iter().take(2).cloned().collect::<Vec<_>>().join("::");
    let modules: BTreeSet<&[String]> = sources.iter().map(|s| s.module.as_slice()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // The binary is a crate of its own: its `crate::` is not the library's.
    for source in sources
        .iter()
        .filter(|s| s.module != ["lib"] && s.module[0] != "bin")
    {
        let code = code_only(&source.text);
        let from = node(&source.module);
        let edges = graph.entry(from.clone()).or_default();
        for mut path in uses(source, &code) {
            if let Some(real) = path.first().and_then(|first| exports.get(first)) {
                path.splice(..1, real.iter().cloned());
            }
            // The module the path names, or the one that defines the item it names.
            let Some(module) = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|m| modules.contains(*m))
            else {
                continue; // `crate::` as a macro spells it, not a module of the tree
            };
            let to = node(module);
            if to != from {
                edges.insert(to);
            }
        }
    }
    graph
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let mut wrong = Vec::new();
    for (from, to) in graph() {
        let here = layer(&from.split("::").map(String::from).collect::<Vec<_>>()).expect("a layer");
        for used in to {
            let there = layer(&used.split("::").map(String::from).collect::<Vec<_>>()).unwrap();
            if there > here {
                wrong.push(format!("{from} uses {used}, a layer above its own"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn modules_use_each_other_in_no_circle() {
    let graph = graph();
    // Depth-first search; a back edge closes a circle.
    fn visit<'a>(
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        at: &'a str,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        circles: &mut Vec<String>,
    ) {
        if done.contains(at) {
            return;
        }
        if let Some(i) = stack.iter().position(|m| *m == at) {
            circles.push(format!("{} -> {at}", stack[i..].join(" -> ")));
            return;
        }
        stack.push(at);
        for next in graph.get(at).into_iter().flatten() {
            visit(graph, next, stack, done, circles);
        }
        stack.pop();
        done.insert(at);
    }
    let (mut stack, mut done, mut circles) = (Vec::new(), BTreeSet::new(), Vec::new());
    for module in graph.keys() {
        visit(&graph, module, &mut stack, &mut done, &mut circles);
    }
    assert!(
        circles.is_empty(),
        "modules that use each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_file_or_function_is_too_long() {
    let mut long = Vec::new();
    for source in sources() {
        let name = source
            .path
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .unwrap_or(&source.path)
            .display()
            .to_string();
        let lines = source.text.lines().count();
        let head: String = source.text.lines().take(20).collect::<Vec<_>>().join("\n");
        if lines > FILE_LINES && !head.contains(ONE_PIECE) {
            long.push(format!("{name}: {lines} lines"));
        }
        let code = code_only(&source.text);
        let code: Vec<&str> = code.lines().collect();
        let text: Vec<&str> = source.text.lines().collect();
        for (at, line) in code.iter().enumerate() {
            let Some(name_at) = fn_name(line) else { continue };
            let mut depth = 0i32;
            let mut opened = false;
            let mut end = at;
            'scan: for (j, l) in code.iter().enumerate().skip(at) {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        ';' if !opened && depth == 0 => break 'scan, // a declaration without a body
                        _ => {}
                    }
                    if opened && depth == 0 {
                        end = j;
                        break 'scan;
                    }
                }
            }
            let len = end + 1 - at;
            let said = text[at.saturating_sub(12)..at]
                .iter()
                .any(|l| l.contains(ONE_PIECE));
            if len > FN_LINES && !said {
                long.push(format!("{name}:{}: fn {name_at}, {len} lines", at + 1));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {FILE_LINES} lines a file or {FN_LINES} a function, with no `{ONE_PIECE}` comment saying why:\n{}",
        long.join("\n")
    );
}

/// The name of the function a line of code starts, if it does.
fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let before_ok = words[..at].iter().all(|w| {
        w.starts_with("pub")
            || ["async", "const", "unsafe", "extern", "default"].contains(w)
            || w.ends_with(')')
    });
    let name: String = words
        .get(at + 1)?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (before_ok && !name.is_empty()).then_some(name)
}

#[test]
fn the_check_reads_uses_as_written() {
    let paths = expand("{a::b, c::{d, e::f}, g}");
    assert_eq!(
        paths,
        [vec!["a", "b"], vec!["c", "d"], vec!["c", "e", "f"], vec!["g"]]
    );
    let code = code_only("let s = \"crate::x\"; // crate::y\nuse crate::z; let c = '{'; fn f<'a>() {}");
    assert!(!code.contains("crate::x") && !code.contains("crate::y") && code.contains("crate::z"));
    assert!(!code.contains("'{'") && code.contains("f<'a>"));
    assert!(reexport("pub(crate) use crate::a::B;", "pub(crate) use ".len()));
    assert_eq!(
        fn_name("    pub(crate) async fn go(&self) {").as_deref(),
        Some("go")
    );
    assert_eq!(fn_name("    let fn_x = 1;"), None);
}
