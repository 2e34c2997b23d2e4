//! Every repository path the docs name exists: a `code span` that starts with one of the
//! repository's top-level folders (`search/src/run/mod.rs`, `scripts/gpu_check.sh`) in the
//! README, ARCHITECTURE, CONTRIBUTING, the guide, the reference, the design notes and the
//! folders' READMEs, and every relative link in any doc. Dated result pages are records of
//! their day: only their links are checked. A path inside a run folder (`frozen/model.qdf`)
//! is not a repository path.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Markdown files under `dir`, recursively.
fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | "vendor" | "results" | "node_modules")
                && !name.starts_with('.')
            {
                markdown(&p, out);
            }
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

/// The repository's top-level folders.
fn top_folders(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .expect("the repository")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.') && n != "target" && n != "results")
        .collect()
}

/// Paths in code spans: one token of path characters with a `/`, under a top-level folder.
fn code_paths(text: &str, tops: &[String]) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| !span.is_empty() && span.chars().all(path_char) && span.contains('/'))
        .filter(|span| tops.iter().any(|t| span.split('/').next() == Some(t.as_str())))
        // Files a run writes into its own `frozen/` folder.
        .filter(|span| {
            !span.starts_with("frozen/model.") && !span.starts_with("frozen/predictions")
        })
        .map(str::to_string)
        .collect()
}

/// Targets of relative links `](target)` (anchors and URLs left out).
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split([')', ' ']).next())
        .map(|t| t.split('#').next().unwrap_or("").to_string())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

#[test]
fn every_repository_path_a_doc_names_exists() {
    let root = root();
    let tops = top_folders(&root);
    let mut docs = Vec::new();
    markdown(&root, &mut docs);
    // The walk leaves out folders named `results`; the dated pages' links are checked apart.
    let mut results = Vec::new();
    markdown(&root.join("docs/results"), &mut results);
    assert!(docs.len() > 10, "found only {docs:?}");
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("a doc");
        for p in code_paths(&text, &tops) {
            if !root.join(p.trim_end_matches('/')).exists() {
                missing.push(format!("{}: `{p}`", doc.display()));
            }
        }
    }
    for doc in docs.iter().chain(&results) {
        let text = std::fs::read_to_string(doc).expect("a doc");
        let here = doc.parent().expect("a folder");
        for l in links(&text) {
            if !here.join(&l).exists() {
                missing.push(format!("{}: link {l}", doc.display()));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "paths named in docs that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn the_path_finder_sees_what_it_should() {
    let tops = vec!["search".to_string(), "scripts".to_string()];
    let text = "see `search/src/run/mod.rs`, `qdarts search`, `a/b`, `frozen/model.qdf` and \
                [x](../guide/backends.md#top), [y](https://burn.dev)";
    assert_eq!(code_paths(text, &tops), ["search/src/run/mod.rs"]);
    assert_eq!(links(text), ["../guide/backends.md"]);
}
