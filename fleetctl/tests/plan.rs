//! `fleetctl plan` and `fleetctl explain` on the example fleet, as snapshots (insta), plus
//! the exit codes: 0 all placed, 2 some unplaced, 1 invalid input.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl")).args(args).current_dir(repo()).output().expect("run fleetctl")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn plan_of_the_example_fleet() {
    let out = fleetctl(&["plan", "-f", "examples/fleet"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    insta::assert_snapshot!("plan_examples_fleet", stdout(&out));
}

#[test]
fn plan_json_is_byte_identical_across_runs() {
    let a = fleetctl(&["plan", "-f", "examples/fleet", "-o", "json"]);
    let b = fleetctl(&["plan", "-f", "examples/fleet", "-o", "json"]);
    assert_eq!(a.stdout, b.stdout);
    let plan: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    // The EU-sovereign deployment has nothing outside the EU.
    let eu = plan["deployments"].as_array().unwrap().iter().find(|d| d["name"] == "llama-3.3-70b-eu").unwrap();
    let clusters: Vec<&str> =
        eu["assignments"].as_array().unwrap().iter().map(|a| a["cluster"].as_str().unwrap()).collect();
    assert!(!clusters.is_empty());
    assert!(clusters.iter().all(|c| c.starts_with("eu-")), "{clusters:?}");
}

#[test]
fn explain_of_the_sovereign_deployment() {
    let out = fleetctl(&["explain", "-f", "examples/fleet", "modeldeployment/ml/llama-3.3-70b-eu"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    insta::assert_snapshot!("explain_llama_70b_eu", stdout(&out));
}

#[test]
fn unplaced_replicas_exit_2_with_reasons_per_cluster() {
    let dir = tempdir();
    copy_dir(&repo().join("examples/fleet"), &dir);
    let file = dir.join("deployments/llama-3.3-70b-eu.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text
        .lines()
        .map(|l| if l.starts_with("  replicas:") { "  replicas: 40" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, text).unwrap();
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(text.contains("UNPLACED"), "{text}");
    assert!(text.contains("ml/llama-3.3-70b-eu: "), "{text}");
    for us in ["us-iad-1", "us-pdx-1", "ap-nrt-1"] {
        assert!(
            text.lines().any(|l| l.contains(us) && l.contains("JurisdictionNotAllowed")),
            "{us} reason missing:\n{text}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn invalid_input_exits_1_and_plans_nothing() {
    let out = fleetctl(&["plan", "-f", "tests/fixtures/invalid/05-negative-replicas.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.replicas"));
}

fn tempdir() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("fleetctl-plan-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
