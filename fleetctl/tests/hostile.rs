//! `fleetctl validate` on hostile input: every case under `tests/fixtures/hostile/` (deep or
//! costly selectors, quantities Kubernetes cannot hold, a YAML alias bomb, nesting past the
//! depth bound) must end with exit
//! code 1 and its own clear error (each `.expect`: line 1 the field, line 2 the message),
//! never a crash (101 panic, 134 abort on stack overflow, 137 killed), under a 256 MiB
//! address-space limit (`prlimit --as`) and a 20 s kill guard (`timeout -s KILL`): a guard
//! against a hang, not a speed assertion. Without util-linux `prlimit` or coreutils
//! `timeout` the cases run unguarded (and say so). A directory symlink loop is built at run
//! time in a temporary directory; a UTF-8 byte-order mark is accepted, as kubectl does. The
//! inputs too large to commit (100,000-deep flow mappings, aliases over 1,000 documents of a
//! file and over 14 files of a run) are written at run time by
//! `tests/fixtures/hostile/generate.sh`; each error names its file, line and bound.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::Path;
use std::process::{Command, Output};

mod fixture_cases;

use fixture_cases::repo;

const MEMORY_LIMIT: &str = "--as=268435456";
const KILL_AFTER_SECONDS: &str = "20";

fn available(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// `fleetctl args…` under the memory limit and the kill guard when the tools exist.
fn guarded(args: &[&str]) -> Output {
    let fleetctl = env!("CARGO_BIN_EXE_fleetctl");
    let mut cmd = if available("timeout") && available("prlimit") {
        let mut c = Command::new("timeout");
        c.args(["-s", "KILL", KILL_AFTER_SECONDS, "prlimit", MEMORY_LIMIT, fleetctl]);
        c
    } else {
        eprintln!("note: prlimit or timeout missing; running without the memory limit and kill guard");
        Command::new(fleetctl)
    };
    cmd.args(args).current_dir(repo()).output().expect("run fleetctl")
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_hostile_fixture_fails_with_its_error_and_never_crashes() {
    let mut failures = Vec::new();
    for fixture_cases::Case { rel, field, message } in fixture_cases::cases("hostile", 16) {
        let (field, message) = (field.as_str(), message.as_str());
        let out = guarded(&["validate", "-f", &rel]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line =
            stderr.lines().find(|l| l.contains(": error: ") && l.contains(field) && l.contains(message)).is_some();
        if out.status.code() != Some(1) || !line || !stderr.contains(&rel) {
            failures.push(format!(
                "{rel}: wanted exit 1 and an error naming {field:?} and {message:?}; {}",
                describe(&out)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_directory_symlink_loop_is_refused_not_walked() {
    let tmp = tempfile::tempdir().unwrap();
    let class =
        std::fs::read_to_string(repo().join("tests/fixtures/hostile/01-selector-nested-55-parens.yaml")).unwrap();
    let first_doc = class.split("\n---\n").next().unwrap();
    std::fs::write(tmp.path().join("class.yaml"), first_doc).unwrap();
    // Without cycle detection these two links make 2^40 paths of the one file.
    std::os::unix::fs::symlink(".", tmp.path().join("a")).unwrap();
    std::os::unix::fs::symlink(".", tmp.path().join("b")).unwrap();
    let path = tmp.path().to_string_lossy().to_string();
    let out = guarded(&["validate", "-f", &path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr.contains("directory cycle through a symlink"), "{}", describe(&out));
    assert!(stderr.contains(&format!("{}", Path::new(&path).join("a").display())), "{}", describe(&out));
}

#[test]
fn a_symlink_to_a_directory_already_read_reads_its_files_once() {
    let tmp = tempfile::tempdir().unwrap();
    let class =
        std::fs::read_to_string(repo().join("tests/fixtures/hostile/01-selector-nested-55-parens.yaml")).unwrap();
    std::fs::create_dir(tmp.path().join("real")).unwrap();
    std::fs::write(tmp.path().join("real/class.yaml"), class.split("\n---\n").next().unwrap()).unwrap();
    std::os::unix::fs::symlink("real", tmp.path().join("alias")).unwrap();
    let out = guarded(&["validate", "-f", &tmp.path().to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "no duplicate-name error: {}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 file(s)"), "{}", describe(&out));
}

#[test]
fn a_utf8_byte_order_mark_is_accepted_like_kubectl_does() {
    let tmp = tempfile::tempdir().unwrap();
    let class =
        std::fs::read_to_string(repo().join("tests/fixtures/hostile/01-selector-nested-55-parens.yaml")).unwrap();
    let file = tmp.path().join("class.yaml");
    let document: Vec<&str> = class.split("\n---\n").next().unwrap().lines().filter(|l| !l.starts_with('#')).collect();
    std::fs::write(&file, format!("\u{feff}{}\n", document.join("\n"))).unwrap();
    let out = guarded(&["validate", "-f", &file.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 Flotilla object(s)"), "{}", describe(&out));
}

/// Runs `generate.sh` into a temporary directory.
fn generated() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let script = repo().join("tests/fixtures/hostile/generate.sh");
    let out = Command::new("bash").arg(&script).arg(tmp.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    tmp
}

fn errors(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains(": error: ")).map(str::to_string).collect()
}

#[test]
fn nesting_100000_deep_is_refused_at_its_line_and_column_in_json_and_yaml() {
    let tmp = generated();
    for (file, at) in [("deep-flow.json", "1 (document 1)"), ("deep-flow.yaml", "1 (document 1)")] {
        let path = tmp.path().join(file).to_string_lossy().to_string();
        let out = guarded(&["validate", "-f", &path]);
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        let errors = errors(&out);
        assert_eq!(errors.len(), 1, "{}", describe(&out));
        let column = if file.ends_with("json") { "at line 1, column 316" } else { "at line 5, column 254" };
        assert!(errors[0].starts_with(&format!("{path}:{at}: error: ")), "{}", errors[0]);
        assert!(errors[0].contains("nests more than 64 levels deep") && errors[0].contains(column), "{}", errors[0]);
    }
}

#[test]
fn aliases_over_1000_documents_of_one_file_are_bounded_per_file() {
    let tmp = generated();
    let path = tmp.path().join("aliases-1000.yaml").to_string_lossy().to_string();
    let out = guarded(&["validate", "-f", &path]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let bound = "this file's documents together expand to more than 100000 nodes";
    let refused: Vec<String> = errors(&out).into_iter().filter(|l| l.contains(bound)).collect();
    // Each document is 8 lines from its `---`: document n starts at line 8(n-1)+2. The first
    // is within the bound (and then refused for its own fields); the 999 after it pass the
    // file's bound, each at its own line.
    assert_eq!(refused.len(), 999, "{}", describe(&out));
    assert!(refused[0].starts_with(&format!("{path}:10 (document 2): error: ")), "{}", refused[0]);
    assert!(refused[998].starts_with(&format!("{path}:7994 (document 1000): error: ")), "{}", refused[998]);
    assert!(!errors(&out).iter().any(|l| l.contains("(document 1)") && l.contains(bound)), "{}", describe(&out));
}

#[test]
fn aliases_over_the_files_of_one_run_are_bounded_per_run() {
    let tmp = generated();
    let dir = tmp.path().join("run").to_string_lossy().to_string();
    let out = guarded(&["validate", "-f", &dir]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let bound = "the files read together expand to more than 1000000 nodes";
    let refused: Vec<String> = errors(&out).into_iter().filter(|l| l.contains(bound)).collect();
    // Each file adds about 77,000 nodes beyond its text (80,600 counted, 1,733 bytes): twelve
    // fit the run's 1,000,000, the thirteenth passes it, and the fourteenth finds it spent.
    // No file alone passes its own bound.
    assert_eq!(refused.len(), 2, "{}", describe(&out));
    assert!(refused[0].starts_with(&format!("{dir}/13.yaml:2 (document 1): error: ")), "{}", refused[0]);
    assert!(refused[1].starts_with(&format!("{dir}/14.yaml:2 (document 1): error: ")), "{}", refused[1]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("this file's documents"), "{}", describe(&out));
}
