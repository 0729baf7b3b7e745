//! The API server and `fleetctl validate` agree: every object of `examples/fleet` is accepted
//! by a real kube-apiserver with the generated CRDs (strict field validation), and every
//! schema-level invalid fixture is refused by it too — so the CRDs' CEL rules and schema
//! constraints are real, not only client-side. Run by `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use harness::{Fleet, install_crds, repo, try_apply};

fn documents(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .filter_map(|d| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).ok()?;
            (!v.is_null()).then(|| serde_json::to_value(v).unwrap())
        })
        .collect()
}

fn yaml_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml") {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn api_server_accepts_the_example_fleet_and_refuses_schema_level_fixtures() {
    let fleet = Fleet::up("apply", &["control"]);
    let control = fleet.client("control").await;
    install_crds(&control).await;

    let mut files = Vec::new();
    yaml_files(&repo().join("examples/fleet"), &mut files);
    // Namespaces first, then everything else.
    let mut docs: Vec<serde_json::Value> = files.iter().flat_map(|f| documents(f)).collect();
    docs.sort_by_key(|d| d["kind"] != "Namespace");
    assert!(docs.len() >= 20);
    for d in docs {
        let id = format!("{} {}", d["kind"], d["metadata"]["name"]);
        if let Err(e) = try_apply(&control, d).await {
            panic!("the API server refused {id} from examples/fleet, which fleetctl validate accepts: {e}");
        }
    }

    // Fixtures whose one problem is for the schema or a CRD rule: the API server refuses them.
    let schema_level = [
        "02-unknown-field",
        "05-negative-replicas",
        "06-min-nodes-above-max",
        "10-missing-required-field",
        "11-bad-jurisdiction-code",
        "12-empty-alternatives",
        "13-provider-two-kinds",
        "17-standalone-multi-device",
        "18-disaggregated-without-roles",
        "23-bad-price-format",
        "25-bad-duration",
        "34-disruption-budget-both",
        "35-disruption-budget-percent",
        "36-routing-weight-out-of-range",
        "37-autoscaling-no-target",
        "38-autoscaling-min-above-max",
    ];
    let mut agreed = Vec::new();
    for name in schema_level {
        let path = repo().join(format!("tests/fixtures/invalid/{name}.yaml"));
        let mut refused = None;
        for (i, d) in documents(&path).into_iter().enumerate() {
            // Rename so fixtures do not collide with each other or the example fleet.
            let mut d = d;
            let n = d["metadata"]["name"].as_str().unwrap_or("x").to_string();
            d["metadata"]["name"] = serde_json::json!(format!("{n}-fx{}", &name[..2]));
            if d["metadata"].get("namespace").is_some() {
                d["metadata"]["namespace"] = serde_json::json!("ml");
            }
            if let Err(e) = try_apply(&control, d).await {
                refused = Some((i, e.to_string()));
            }
        }
        let (doc, err) = refused.unwrap_or_else(|| panic!("the API server accepted every document of {name}"));
        agreed.push(format!("{name}: document {} refused: {}", doc + 1, err.chars().take(160).collect::<String>()));
    }
    eprintln!("{}", agreed.join("\n"));
}
