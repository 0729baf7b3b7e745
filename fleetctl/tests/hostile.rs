//! `fleetctl validate` on hostile input: every case under `tests/fixtures/hostile/` (deep or
//! costly selectors, quantities Kubernetes cannot hold, a YAML alias bomb) must end with exit
//! code 1 and its own clear error (each `.expect`: line 1 the field, line 2 the message),
//! never a crash (101 panic, 134 abort on stack overflow, 137 killed), under a 256 MiB
//! address-space limit (`prlimit --as`) and a 20 s kill guard (`timeout -s KILL`): a guard
//! against a hang, not a speed assertion. Without util-linux `prlimit` or coreutils
//! `timeout` the cases run unguarded (and say so). A directory symlink loop is built at run
//! time in a temporary directory; a UTF-8 byte-order mark is accepted, as kubectl does.

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
    for fixture_cases::Case { rel, field, message } in fixture_cases::cases("hostile", 13) {
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
