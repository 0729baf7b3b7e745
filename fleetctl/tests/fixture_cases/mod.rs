//! The fixture folders `validate` and `hostile` share: every `*.yaml` under a folder of
//! `tests/fixtures/`, sorted, with its `.expect` (line 1 the field, line 2 the message).

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::PathBuf;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One fixture: its path from the repository root and the field and message it must give.
pub struct Case {
    pub rel: String,
    pub field: String,
    pub message: String,
}

/// The cases under `tests/fixtures/<folder>`, at least `min` of them.
pub fn cases(folder: &str, min: usize) -> Vec<Case> {
    let dir = repo().join("tests/fixtures").join(folder);
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= min, "at least {min} {folder} fixtures, found {}", fixtures.len());
    fixtures
        .iter()
        .map(|fixture| {
            let rel = fixture.strip_prefix(repo()).unwrap().to_string_lossy().to_string();
            let expect =
                std::fs::read_to_string(fixture.with_extension("expect")).unwrap_or_else(|e| panic!("{rel}: {e}"));
            let mut lines = expect.lines();
            let (field, message) = (lines.next().unwrap_or("").to_string(), lines.next().unwrap_or("").to_string());
            Case { rel, field, message }
        })
        .collect()
}
