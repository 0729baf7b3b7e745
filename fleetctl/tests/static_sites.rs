//! Two `static` clusters in one region (two on-premises clusters at one site) are a valid
//! fleet: `fleetctl plan` plans it, with and without `--cloud`, and a claim preview offers
//! each cluster's own pools, naming the cluster the nodes would join.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl")).args(args).current_dir(repo()).output().expect("run fleetctl")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The second cluster of the Amsterdam site: same region (`nl-ams`), its own pool of a
/// class the first cluster does not have.
const SECOND_AMS: &str = r#"
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata:
  name: eu-ams-onprem-2
  labels: {flotilla.dev/env: prod, tier: standard, flotilla.dev/site: on-prem}
spec:
  provider:
    static: {site: "Amsterdam colocation, hall 4"}
  region: nl-ams
  zones: [nl-ams-hall4]
  jurisdiction: EU
  country: NL
  credentials:
    secretRef: {namespace: flotilla-system-members, name: eu-ams-onprem-2-kubeconfig}
  endpoint: https://inference.ams2.corp.example.com
  pools:
  - {name: h200, class: h200-141g, minNodes: 1, maxNodes: 1, nodes: 1, capacityTypes: [reserved]}
"#;

/// The example fleet plus a second static cluster in `nl-ams`; the EU deployment wants
/// `replicas` replicas.
fn two_sites(replicas: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetctl-static-{}-{replicas}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    copy_dir(&repo().join("examples/fleet"), &dir);
    // Without the teams' quotas (the search team is over its own on purpose): everything fits.
    std::fs::remove_file(dir.join("quotas.yaml")).unwrap();
    std::fs::write(dir.join("clusters-ams-2.yaml"), SECOND_AMS).unwrap();
    let file = dir.join("deployments/llama-3.3-70b-eu.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let text: Vec<String> = text
        .lines()
        .map(|l| if l.starts_with("  replicas:") { format!("  replicas: {replicas}") } else { l.to_string() })
        .collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    dir
}

#[test]
fn two_static_clusters_in_one_region_plan_when_everything_fits() {
    let dir = two_sites(6);
    for extra in [&[][..], &["--cloud", "examples/cloud/sim.yaml"][..]] {
        let mut args = vec!["plan", "-f", dir.to_str().unwrap(), "-o", "json"];
        args.extend_from_slice(extra);
        let out = fleetctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {stderr}");
        assert!(!stderr.contains("DuplicateRegion"), "{stderr}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["claims"], serde_json::json!([]), "everything fits: no claim");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_claim_preview_offers_each_static_cluster_of_a_region_as_itself() {
    let dir = two_sites(40);
    let out = fleetctl(&["plan", "-f", dir.to_str().unwrap(), "-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let preview = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["deployment"] == "llama-3.3-70b-eu")
        .unwrap_or_else(|| panic!("no preview: {doc}"));
    assert_eq!(preview["outcome"], "Claim", "{preview}");
    let tries: Vec<(String, String, String)> = preview["tries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap().to_string();
            (s("region"), s("cluster"), s("class"))
        })
        .collect();
    // H200 (the first alternative) is only in the second cluster, A100 only in the first:
    // each offering joins the cluster whose pool it is, and each region is tried once.
    let h200: Vec<_> = tries.iter().filter(|t| t.2 == "h200-141g").collect();
    assert!(!h200.is_empty(), "{tries:?}");
    assert!(h200.iter().all(|t| t.0 == "nl-ams" && t.1 == "eu-ams-onprem-2"), "{tries:?}");
    let a100: Vec<_> = tries.iter().filter(|t| t.2 == "a100-sxm-80g").collect();
    assert_eq!(a100.len(), 1, "one a100 offering, listed once: {tries:?}");
    assert_eq!(a100[0].1, "eu-ams-onprem", "{tries:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A generated fleet (as `gen_fleet` writes it) whose `static` clusters share regions plans:
/// exit 0 or 2, never 1. The 1,000 × 5,000 fleet of docs/benchmarks.md has the same layout
/// (89 static clusters over 14 regions); this one is smaller to keep the test quick.
#[test]
fn a_generated_fleet_with_static_clusters_sharing_regions_plans() {
    use flotilla_apis::FleetObject;
    use flotilla_placement::generate::{GenSpec, generate_objects};
    let objects = generate_objects(&GenSpec { clusters: 200, deployments: 300, seed: 1 });
    let mut static_regions: Vec<&str> = objects
        .iter()
        .filter_map(|o| match o {
            FleetObject::Cluster(c) if c.spec.provider.static_.is_some() => Some(c.spec.region.as_str()),
            _ => None,
        })
        .collect();
    static_regions.sort_unstable();
    let distinct = {
        let mut d = static_regions.clone();
        d.dedup();
        d.len()
    };
    assert!(distinct < static_regions.len(), "the fleet must have two static clusters in one region");
    let docs: Vec<String> =
        objects.iter().map(|o| o.to_json().map(|v| v.to_string())).collect::<Result<_, _>>().unwrap();
    let file = std::env::temp_dir().join(format!("fleetctl-generated-{}.yaml", std::process::id()));
    std::fs::write(&file, docs.join("\n---\n")).unwrap();
    let out = fleetctl(&["plan", "-f", file.to_str().unwrap(), "-o", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 2)), "{stderr}");
    assert!(!stderr.contains("DuplicateRegion"), "{stderr}");
    std::fs::remove_file(&file).ok();
}
