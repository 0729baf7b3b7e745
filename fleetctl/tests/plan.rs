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
    // 2: the search team is over its FleetQuota on purpose (examples/fleet/quotas.yaml).
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
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
    // Everything fits but what search's quota holds back; no claim would be made for it.
    let short: Vec<&str> = plan["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["unplaced"] != 0)
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(short, ["llama-3.3-70b-search"]);
    let claims = plan["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!((claims[0]["outcome"].as_str(), claims[0]["claim"].is_null()), (Some("QuotaExceeded"), true));
    // The quotas' usage: ml within both of its limits, search at its own.
    let quotas = plan["quotas"].as_array().unwrap();
    let usage: Vec<(&str, u64, u64)> =
        quotas
            .iter()
            .flat_map(|q| {
                q["limits"].as_array().unwrap().iter().map(move |l| {
                    (q["name"].as_str().unwrap(), l["used"].as_u64().unwrap(), l["max"].as_u64().unwrap())
                })
            })
            .collect();
    assert_eq!(usage, [("gpu-budget", 36, 48), ("gpu-budget", 519_531_250, 2_000_000_000), ("gpus", 8, 8)]);
    assert_eq!(quotas[1]["unplaced"], 1);
}

#[test]
fn the_over_quota_team_is_told_why_and_raising_its_quota_places_the_replica() {
    let out = fleetctl(&["plan", "-f", "examples/fleet"]);
    let text = stdout(&out);
    assert!(text.contains("search/gpus    devices 8/8"), "{text}");
    assert!(
        text.contains("FleetQuota search/gpus: devices 8 of 8 used in the namespace; one more replica here needs 4")
    );
    let dir = tempdir();
    copy_dir(&repo().join("examples/fleet"), &dir);
    let quotas = dir.join("quotas.yaml");
    let raised = std::fs::read_to_string(&quotas).unwrap().replace("  - max: 8\n", "  - max: 12\n");
    std::fs::write(&quotas, raised).unwrap();
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("search/gpus    devices 12/12"), "{}", stdout(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn explain_of_the_sovereign_deployment() {
    let out = fleetctl(&["explain", "-f", "examples/fleet", "modeldeployment/ml/llama-3.3-70b-eu"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    insta::assert_snapshot!("explain_llama_70b_eu", stdout(&out));
}

#[test]
fn explain_with_exact_explains_the_exact_modes_plan() {
    // A crowded fleet where the exact mode places more replicas than the greedy (and fast: the
    // exact mode's 10 s limit is far even in a debug build under load).
    let dir = tempdir();
    let file = dir.join("crowded.yaml");
    let spec = flotilla_placement::generate::GenSpec { clusters: 4, deployments: 10, seed: 3 };
    let mut text = String::new();
    for object in flotilla_placement::crowded::generate_crowded_objects(&spec) {
        text.push_str(&format!("---\n{}\n", object.to_json().unwrap()));
    }
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let placed = |args: &[&str]| -> std::collections::BTreeMap<String, u64> {
        let out = fleetctl(&[&["plan", "-f", path, "-o", "json"], args].concat());
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        plan["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let n = d["assignments"].as_array().unwrap().iter().map(|a| a["replicas"].as_u64().unwrap()).sum();
                (format!("{}/{}", d["namespace"].as_str().unwrap(), d["name"].as_str().unwrap()), n)
            })
            .collect()
    };
    let (greedy, exact) = (placed(&[]), placed(&["--exact"]));
    let (name, &n) = exact.iter().find(|(k, n)| greedy[*k] < **n).expect("a deployment the exact mode places more of");
    // Explained with --exact: the exact mode's count per cluster, and the line saying so; without
    // it, the greedy's.
    let with = fleetctl(&["explain", "-f", path, name, "--exact", "-o", "json"]);
    assert_eq!(with.status.code(), Some(0), "{}", String::from_utf8_lossy(&with.stderr));
    let explained: serde_json::Value = serde_json::from_slice(&with.stdout).unwrap();
    let per_cluster = |v: &serde_json::Value| -> u64 {
        v["explanation"].as_array().unwrap().iter().map(|c| c["placed"].as_u64().unwrap_or(0)).sum()
    };
    assert_eq!(per_cluster(&explained), n, "{explained:#}");
    let without = fleetctl(&["explain", "-f", path, name, "-o", "json"]);
    let explained: serde_json::Value = serde_json::from_slice(&without.stdout).unwrap();
    assert_eq!(per_cluster(&explained), greedy[name]);
    let table = stdout(&fleetctl(&["explain", "-f", path, name, "--exact"]));
    assert!(table.contains("exact mode: plan by the greedy guided by the exact optimum"), "{table}");
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
    // By default the rejections are summarised per reason, every reason counted.
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(text.contains("UNPLACED"), "{text}");
    assert!(text.contains("ml/llama-3.3-70b-eu: "), "{text}");
    assert!(text.contains(" cluster(s): 4 JurisdictionNotAllowed"), "{text}");
    assert!(text.contains("  ... and 1 more JurisdictionNotAllowed"), "{text}");
    // In full, every cluster with its reason.
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap(), "--rejections", "full"]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(!text.contains("... and "), "{text}");
    for us in ["us-iad-1", "us-pdx-1", "ap-nrt-1"] {
        assert!(
            text.lines().any(|l| l.contains(us) && l.contains("JurisdictionNotAllowed")),
            "{us} reason missing:\n{text}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A copy of the example fleet with some deployments' replicas changed.
fn fleet_with_replicas(changes: &[(&str, u32)]) -> PathBuf {
    let dir = tempdir();
    copy_dir(&repo().join("examples/fleet"), &dir);
    for (name, replicas) in changes {
        let file = dir.join(format!("deployments/{name}.yaml"));
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text
            .lines()
            .map(|l| if l.starts_with("  replicas:") { format!("  replicas: {replicas}") } else { l.to_string() })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&file, text).unwrap();
    }
    dir
}

fn claims_section(text: &str) -> &str {
    text.split_once("\nCLAIMS").map_or("", |(_, claims)| claims)
}

#[test]
fn unplaced_deployment_previews_its_claim_and_first_offering() {
    let dir = fleet_with_replicas(&[("llama-3.3-70b-eu", 40)]);
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap(), "--cloud", "examples/cloud/sim.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    let claims = claims_section(&text);
    let lines: Vec<&str> = claims.lines().collect();
    let at = lines
        .iter()
        .position(|l| {
            l.starts_with(
                "ml/llama-3.3-70b-eu: would create CapacityClaim ml/llama-3.3-70b-eu with 1 pod set(s): replicas ",
            )
        })
        .unwrap_or_else(|| panic!("no claim line:\n{text}"));
    assert!(lines[at].ends_with("pod(s) × 4 device(s)"), "{}", lines[at]);
    // Reserved before on-demand, H200 before the selector alternative, cheapest first; the
    // sim cloud's cheaper US reservation is outside the deployment's EU sovereignty.
    assert!(
        lines[at + 1].starts_with(
            "  first try: reserved h200-141g p5en.48xlarge in eu-central-1/eu-central-1a (sim, joins eu-fra-1), "
        ),
        "{}",
        lines[at + 1]
    );
    assert!(lines[at + 1].contains("at $60.50/node-h; then "), "{}", lines[at + 1]);
    // Absence: nothing outside the EU, and no claim for the deployments that fit.
    assert!(!claims.contains("us-east-1") && !claims.contains("us-iad-1"), "{claims}");
    for fits in ["gpt-oss-120b", "llama-3.1-8b-spot", "llama-3.1-8b-canary", "llama-3.1-405b-fp8", "qwen3-235b-disagg"]
    {
        assert!(!claims.contains(fits), "{fits} fits but has a claim:\n{claims}");
    }

    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap(), "--cloud", "examples/cloud/sim.yaml", "-o", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["deployments"].as_array().is_some_and(|d| d.len() == 7));
    // (and search's, which its quota holds back: no claim)
    let previews: Vec<&serde_json::Value> =
        doc["claims"].as_array().unwrap().iter().filter(|p| p["outcome"] != "QuotaExceeded").collect();
    assert_eq!(previews.len(), 1, "{previews:?}");
    let p = &previews[0];
    assert_eq!((p["deployment"].as_str(), p["outcome"].as_str()), (Some("llama-3.3-70b-eu"), Some("Claim")));
    assert_eq!(p["claim"]["podSets"][0]["devicesPerPod"], 4);
    let tries = p["tries"].as_array().unwrap();
    assert_eq!(
        (tries[0]["region"].as_str(), tries[0]["capacityType"].as_str()),
        (Some("eu-central-1"), Some("reserved"))
    );
    assert!(tries.iter().all(|t| ["eu-central-1", "eu-west-3", "nl-ams"].contains(&t["region"].as_str().unwrap())));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_offerings_or_template_the_preview_says_what_to_add() {
    // The 405B deployment is US-only; without --cloud the only provider is the static
    // Amsterdam site. The 8B one has no capacityClaimTemplate.
    let dir = fleet_with_replicas(&[("llama-3.1-405b-fp8", 6), ("llama-3.1-8b-spot", 40)]);
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    let claims = claims_section(&text);
    assert!(claims.contains("ml/llama-3.1-405b-fp8: would create CapacityClaim"), "{claims}");
    assert!(
        claims.contains(
            "no provider offers capacity in a region spec.capacity.sovereignty allows (regions served: nl-ams (EU))"
        ),
        "{claims}"
    );
    assert!(claims.contains("add a --cloud file or a static pool of h200-141g in an allowed region"), "{claims}");
    assert!(!claims.contains("first try"), "{claims}");
    assert!(
        claims.lines().any(|l| l.starts_with("ml/llama-3.1-8b-spot: no CapacityClaim would be made")
            && l.contains("no spec.placement.capacityClaimTemplate; add one")),
        "{claims}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_claim_of_the_same_name_in_the_files_is_left_alone() {
    let dir = fleet_with_replicas(&[("llama-3.3-70b-eu", 40)]);
    let claim = std::fs::read_to_string(dir.join("claims.yaml"))
        .unwrap()
        .replace("name: llama-405b-launch", "name: llama-3.3-70b-eu")
        .replace("allowedJurisdictions: [US]", "allowedJurisdictions: [EU]")
        .replace("deniedRegions: [us-west-2]", "deniedRegions: []");
    std::fs::write(dir.join("claims.yaml"), claim).unwrap();
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap(), "--cloud", "examples/cloud/sim.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    let claims = claims_section(&text);
    assert!(
        claims.contains(
            "ml/llama-3.3-70b-eu: the files hold a CapacityClaim ml/llama-3.3-70b-eu of the deployment's name"
        ),
        "{claims}"
    );
    assert!(!claims.contains("would create") && !claims.contains("first try"), "{claims}");
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
