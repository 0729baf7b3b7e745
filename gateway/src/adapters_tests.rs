//! Tests of LoRA adapters in the routing table: routes only where the controller staged the
//! adapter and its policy allows, never the base's other clusters nor its fallbacks (an EU
//! adapter never gets a US route, whatever the status, the base or the cluster health says),
//! names taken first by older deployments, splits, the routing file's checks, API key scopes,
//! and the autoscaler's view (demand names, the deployment a held request raises).

use std::sync::Arc;

use flotilla_apis::cluster::InferenceCluster;
use flotilla_apis::common::{JurisdictionCode, Sovereignty};
use flotilla_apis::deployment::ModelDeployment;
use serde_json::{Value, json};

use crate::RoutingTable;
use crate::fleet::table_file;
use crate::keys::{ApiKey, Refusal};
use crate::table::{ModelSpec, TableFile};

fn cluster(name: &str, juris: &str, ready: bool) -> InferenceCluster {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name},
        "spec": {"provider": {"static": {"site": "lab"}}, "region": format!("{}-1", juris.to_lowercase()),
                 "jurisdiction": juris, "endpoint": format!("http://{name}.example:8000"), "pools": []},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "X",
                    "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    }))
    .unwrap()
}

/// `ns/name` serving `model`, Ready on `ready`, with `adapters` (spec) and `staged` (status:
/// adapter → clusters); `extra` is merged into the spec.
fn deployment(
    id: (&str, &str, &str),
    model: &str,
    ready: &[&str],
    adapters: Value,
    staged: &[(&str, &[&str])],
    extra: Value,
) -> ModelDeployment {
    let (ns, name, created) = id;
    let placements: Vec<Value> = ready
        .iter()
        .map(|c| json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 1, "ready": 1}))
        .collect();
    let status: Vec<Value> = staged.iter().map(|(a, cs)| json!({"name": a, "clusters": cs})).collect();
    let mut spec = json!({"model": {"name": model, "aliases": [format!("{model}-alias")], "source": "hf://o/m"},
        "replicas": 1, "engine": {"image": "vllm"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
        "devices": {"alternatives": [{"class": "h100"}]}, "adapters": adapters});
    if let (Some(s), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        s.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": spec, "status": {"placements": placements, "adapters": status}
    }))
    .unwrap()
}

fn no_secrets(_: Option<&str>, name: &str, _: &str) -> Result<Vec<u8>, String> {
    Err(format!("no Secret {name}"))
}

fn model<'f>(file: &'f TableFile, name: &str) -> Option<&'f ModelSpec> {
    file.models.iter().find(|m| m.name == name)
}

fn clusters_of(m: Option<&ModelSpec>) -> Vec<&str> {
    m.map(|m| m.routes.iter().map(|r| r.cluster.as_str()).collect()).unwrap_or_default()
}

fn eu() -> Vec<JurisdictionCode> {
    vec![JurisdictionCode("EU".into())]
}

const T1: &str = "2026-01-01T00:00:00Z";
const T2: &str = "2026-02-01T00:00:00Z";

#[test]
fn an_adapter_routes_only_to_its_deployments_clusters_where_it_is_staged() {
    let clusters = [cluster("eu1", "EU", true), cluster("eu2", "EU", true), cluster("us1", "US", true)];
    let d = deployment(
        ("ml", "llama", T1),
        "llama",
        &["eu1", "eu2", "us1"],
        json!([{"name": "sql-lora", "cacheRef": "c1", "sovereignty": {"allowedJurisdictions": ["EU"]}},
               {"name": "chat-lora", "cacheRef": "c2"}, {"name": "new-lora", "cacheRef": "c3"}]),
        &[("sql-lora", &["eu1"]), ("chat-lora", &["eu2", "us1"])],
        json!({}),
    );
    let (file, owners, problems) = table_file(&clusters, &[d], &no_secrets);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(owners.len(), 1, "the deployment owns its model only: {owners:?}");
    let sql = model(&file, "sql-lora").unwrap();
    assert_eq!(sql.parent.as_deref(), Some("llama"));
    assert_eq!(sql.sovereignty.allowed_jurisdictions, eu());
    assert_eq!(clusters_of(Some(sql)), ["eu1"]);
    assert!(sql.fallbacks.is_empty() && sql.aliases.is_empty() && sql.deployments.is_empty());
    assert!(sql.routes.iter().all(|r| r.member_route.as_deref() == Some("ml/llama")), "the base's deployment header");
    assert_eq!(clusters_of(model(&file, "chat-lora")), ["eu2", "us1"]);
    // Not staged anywhere yet: listed, with no route (a 503 like any model without one).
    assert_eq!(clusters_of(model(&file, "new-lora")), Vec::<&str>::new());
    assert_eq!(clusters_of(model(&file, "llama")), ["eu1", "eu2", "us1"], "the base is unchanged");
    assert_eq!(model(&file, "llama").unwrap().parent, None);
    let table = RoutingTable::from_file("fleet", file).unwrap();
    let m = table.resolve("sql-lora").unwrap();
    let allowed: Vec<&str> =
        table.allowed_routes(m, &[&m.sovereignty]).iter().map(|r| r.cluster.name.as_str()).collect();
    assert_eq!(allowed, ["eu1"]);
    assert!(table.resolve("new-lora").is_some_and(|m| m.routes.is_empty()));
}

#[test]
fn an_eu_adapter_never_gets_a_us_route_whatever_the_status_base_fallbacks_or_health() {
    // The base may be served anywhere and falls back to a US-only model; the adapter is EU only,
    // and a stale status even lists the US cluster for it.
    let clusters = [cluster("eu1", "EU", false), cluster("eu2", "EU", true), cluster("us1", "US", true)];
    let base = deployment(
        ("ml", "llama", T1),
        "llama",
        &["eu1", "eu2", "us1"],
        json!([{"name": "sql-lora", "cacheRef": "c1", "sovereignty": {"allowedJurisdictions": ["EU"]}}]),
        &[("sql-lora", &["eu1", "eu2", "us1"])],
        json!({"routing": {"fallbackModels": ["us-model"]}}),
    );
    let us = deployment(("ml", "us", T1), "us-model", &["us1"], json!([]), &[], json!({}));
    let (file, _, problems) = table_file(&clusters, &[base.clone(), us.clone()], &no_secrets);
    let sql = model(&file, "sql-lora").unwrap();
    // eu1 is not Ready, us1 is outside the adapter's policy: eu2 only.
    assert_eq!(clusters_of(Some(sql)), ["eu2"]);
    assert!(sql.fallbacks.is_empty(), "the base's fallbacks are not the adapter's");
    assert_eq!(model(&file, "llama").unwrap().fallbacks, ["us-model"]);
    let p = problems.iter().find(|p| p.contains("sql-lora")).unwrap();
    assert!(p.contains("status.adapters[sql-lora] lists cluster us1") && p.contains("does not allow"), "{p}");
    // eu2 down too: the adapter has no route at all, and nothing to fall back to.
    let mut down = clusters.clone();
    down[1] = cluster("eu2", "EU", false);
    let (file, _, _) = table_file(&down, &[base, us], &no_secrets);
    assert_eq!(clusters_of(model(&file, "sql-lora")), Vec::<&str>::new());
    assert_eq!(clusters_of(model(&file, "llama")), ["us1"], "the base's own route to the US stays");
    let table = RoutingTable::from_file("fleet", file).unwrap();
    let m = table.resolve("sql-lora").unwrap();
    assert!(table.allowed_routes(m, &[&m.sovereignty]).is_empty() && m.fallbacks.is_empty());
}

#[test]
fn names_are_taken_by_the_oldest_and_a_wider_adapter_is_left_out() {
    let clusters = [cluster("eu1", "EU", true), cluster("us1", "US", true)];
    let a = |name: &str| json!({"name": name, "cacheRef": "c"});
    let eu_policy = json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}});
    let old = deployment(
        ("ml", "old", T1),
        "llama",
        &["eu1"],
        json!([a("llama"), a("llama-alias"), a("qwen"), a("shared"), a("good"),
               {"name": "wide", "cacheRef": "c", "sovereignty": {"allowedJurisdictions": ["EU", "US"]}}]),
        &[("good", &["eu1"]), ("shared", &["eu1"]), ("qwen", &["eu1"]), ("wide", &["eu1"])],
        eu_policy,
    );
    // Newer: its model name is the older's adapter; another's alias is one; another redeclares one.
    let thief = deployment(("ml", "thief", T2), "shared", &["us1"], json!([]), &[], json!({}));
    let aliased = deployment(("ns2", "aliased", T2), "mistral", &["us1"], json!([a("good")]), &[], json!({}));
    let mut aliased = aliased;
    aliased.spec.model.aliases = vec!["good".into()];
    let qwen = deployment(("ml", "qwen", T2), "qwen", &["us1"], json!([]), &[], json!({}));
    let (file, owners, problems) = table_file(&clusters, &[thief, aliased, old, qwen], &no_secrets);
    let problem = |needle: &str| problems.iter().find(|p| p.contains(needle)).cloned().unwrap_or_default();
    assert!(problem("adapter `llama`").contains("already the model name of this deployment"), "{problems:?}");
    assert!(problem("adapter `llama-alias`").contains("already an alias of this deployment"), "{problems:?}");
    let wide = problem("wide");
    assert!(wide.contains("spec.adapters[wide].sovereignty.allowedJurisdictions") && wide.contains("`US`"), "{wide}");
    assert!(problem("ModelDeployment ml/thief").contains("already a LoRA adapter of ModelDeployment ml/old"));
    let alias = problem("alias `good`");
    assert!(alias.contains("ModelDeployment ns2/aliased") && alias.contains("ml/old"), "{problems:?}");
    let again = problem("ModelDeployment ns2/aliased: adapter `good`");
    assert!(again.contains("already an adapter of ModelDeployment ml/old"), "{problems:?}");
    let names: Vec<&str> = file.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["good", "llama", "mistral", "qwen", "shared"], "the rest routes");
    assert!(!owners.contains_key(&("ml".into(), "thief".into())));
    assert!(problem("ModelDeployment ml/qwen").contains("already a LoRA adapter of ModelDeployment ml/old"));
    assert_eq!(model(&file, "shared").unwrap().parent.as_deref(), Some("llama"));
    assert!(model(&file, "mistral").unwrap().aliases.is_empty());
    // An adapter named like a model younger than it holds the name; the model goes.
    assert_eq!(model(&file, "qwen").unwrap().parent.as_deref(), Some("llama"));
    RoutingTable::from_file("fleet", file).unwrap();
}

#[test]
fn in_a_split_each_adapter_routes_to_its_own_deployment_only() {
    let clusters = [cluster("eu1", "EU", true), cluster("eu2", "EU", true)];
    let stable = deployment(
        ("ml", "stable", T1),
        "chat",
        &["eu1"],
        json!([{"name": "a1", "cacheRef": "c"}]),
        &[("a1", &["eu1"])],
        json!({"routing": {"weight": 90}}),
    );
    let canary = |weight: i32| {
        deployment(
            ("ml", "canary", T2),
            "chat",
            &["eu2"],
            json!([{"name": "a1", "cacheRef": "c"}, {"name": "a2", "cacheRef": "c"}]),
            &[("a1", &["eu2"]), ("a2", &["eu2"])],
            json!({"routing": {"weight": weight}}),
        )
    };
    let (file, _, problems) = table_file(&clusters, &[stable.clone(), canary(10)], &no_secrets);
    assert_eq!(clusters_of(model(&file, "chat")), ["eu1", "eu2"]);
    let a1 = model(&file, "a1").unwrap();
    assert_eq!(clusters_of(Some(a1)), ["eu1"], "the older deployment's adapter, on its clusters only");
    assert!(a1.routes.iter().all(|r| r.deployment.is_none() && r.member_route.as_deref() == Some("ml/stable")));
    let a2 = model(&file, "a2").unwrap();
    assert_eq!((clusters_of(Some(a2)), a2.routes[0].member_route.as_deref()), (vec!["eu2"], Some("ml/canary")));
    assert!(problems.iter().any(|p| p.contains("ml/canary: adapter `a1`") && p.contains("ml/stable")), "{problems:?}");
    RoutingTable::from_file("fleet", file).unwrap();
    // Weight 0 takes no traffic, its adapters' included.
    let (file, _, _) = table_file(&clusters, &[stable, canary(0)], &no_secrets);
    assert_eq!(clusters_of(model(&file, "a2")), Vec::<&str>::new());
}

#[test]
fn a_fallback_never_names_an_adapter() {
    let clusters = [cluster("eu1", "EU", true)];
    let base = deployment(
        ("ml", "llama", T1),
        "llama",
        &["eu1"],
        json!([{"name": "sql-lora", "cacheRef": "c"}]),
        &[("sql-lora", &["eu1"])],
        json!({}),
    );
    let other = deployment(
        ("ml", "qwen", T1),
        "qwen",
        &["eu1"],
        json!([]),
        &[],
        json!({"routing": {"fallbackModels": ["sql-lora", "llama"]}}),
    );
    let (file, _, problems) = table_file(&clusters, &[base, other], &no_secrets);
    assert_eq!(model(&file, "qwen").unwrap().fallbacks, ["llama"]);
    assert!(problems.iter().any(|p| p.contains("fallback `sql-lora` is a LoRA adapter")), "{problems:?}");
}

const FILE: &str = r#"
clusters:
  - {name: eu-1, url: "http://127.0.0.1:1", jurisdiction: EU, region: eu-central-1}
  - {name: us-1, url: "http://127.0.0.1:2", jurisdiction: US, region: us-east-1}
models:
  - name: base
    sovereignty: {allowedJurisdictions: [EU]}
    routes: [{cluster: eu-1}, {cluster: us-1}]
  - name: open
    routes: [{cluster: eu-1}, {cluster: us-1}]
  - name: lora
    parent: base
    routes: [{cluster: eu-1}, {cluster: us-1}]
"#;

#[test]
fn a_routing_file_adapter_is_checked_and_inherits_its_parents_policy() {
    let t = RoutingTable::from_yaml("t", FILE).unwrap();
    let m = t.resolve("lora").unwrap();
    assert_eq!((m.parent.as_deref(), &m.sovereignty.allowed_jurisdictions), (Some("base"), &eu()));
    let allowed: Vec<&str> = t.allowed_routes(m, &[&m.sovereignty]).iter().map(|r| r.cluster.name.as_str()).collect();
    assert_eq!(allowed, ["eu-1"], "no policy of its own: the parent's, never wider");
    let bad = |from: &str, to: &str| RoutingTable::from_yaml("t", &FILE.replace(from, to)).unwrap_err().to_string();
    let e = bad("parent: base", "parent: nope");
    assert!(e.contains("adapter `lora`: parent `nope` is not a model name"), "{e}");
    let e = bad("parent: base", "parent: base\n    sovereignty: {allowedJurisdictions: [US]}");
    assert!(e.contains("sovereignty.allowedJurisdictions") && e.contains("`US`"), "{e}");
    let e = bad("parent: base", "parent: base\n    fallbacks: [open]");
    assert!(e.contains("adapter `lora` lists fallbacks"), "{e}");
    let e = bad("  - name: open\n    routes", "  - name: open\n    fallbacks: [lora]\n    routes");
    assert!(e.contains("fallback `lora` is a LoRA adapter"), "{e}");
    let e = bad(
        "    routes: [{cluster: eu-1}, {cluster: us-1}]\n  - name: open",
        "    routes: [{cluster: eu-1}]\n  - name: open",
    );
    assert!(e.contains("route to cluster `us-1`, where its parent `base` has no route"), "{e}");
    let deeper = format!("{FILE}  - name: deeper\n    parent: lora\n    routes: []\n");
    let e = RoutingTable::from_yaml("t", &deeper).unwrap_err().to_string();
    assert!(e.contains("parent `lora` is an adapter itself"), "{e}");
}

#[test]
fn a_key_allows_an_adapter_only_by_its_own_name() {
    let t = RoutingTable::from_yaml("t", FILE).unwrap();
    let key = |models: &[&str], juris: Vec<JurisdictionCode>| ApiKey {
        id: "k".into(),
        models: models.iter().map(|m| m.to_string()).collect(),
        sovereignty: Sovereignty { allowed_jurisdictions: juris, ..Default::default() },
        requests_per_minute: None,
        tokens_per_minute: None,
    };
    let lora = t.resolve("lora").unwrap();
    assert_eq!(key(&["base"], vec![]).authorize(lora), Err(Refusal::Model), "the base's scope is not its adapters'");
    assert_eq!(key(&["lora"], vec![]).authorize(lora), Ok(()));
    assert_eq!(key(&[], vec![]).authorize(lora), Ok(()), "a key for every model");
    let us = key(&[], vec![JurisdictionCode("US".into())]);
    assert_eq!(us.authorize(lora), Err(Refusal::Jurisdiction), "the adapter's own policy");
}

#[test]
fn the_autoscaler_counts_adapters_with_their_base_and_raises_the_deployment_declaring_one() {
    use crate::autoscale::writer::{activation_target, demand_names};
    let clusters = [cluster("eu1", "EU", true)];
    let zero = json!({"routing": {"weight": 50}, "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": {"queuedPerReplica": 4}}});
    let stable =
        deployment(("ml", "stable", T1), "chat", &[], json!([{"name": "a1", "cacheRef": "c"}]), &[], zero.clone());
    let canary = deployment(
        ("ml", "canary", T2),
        "chat",
        &[],
        json!([{"name": "a1", "cacheRef": "c"}, {"name": "a2", "cacheRef": "c"}]),
        &[],
        zero,
    );
    let other =
        deployment(("ml", "qwen", T1), "qwen", &["eu1"], json!([{"name": "q1", "cacheRef": "c"}]), &[], json!({}));
    let ds = vec![Arc::new(canary), Arc::new(other), Arc::new(stable)];
    let plain: Vec<ModelDeployment> = ds.iter().map(|d| (**d).clone()).collect();
    let (file, owners, _) = table_file(&clusters, &plain, &no_secrets);
    assert!(model(&file, "a2").unwrap().scale_to_zero, "held like its base while a replica starts");
    let table = RoutingTable::from_file("fleet", file).unwrap();
    assert_eq!(demand_names(&table, "chat"), ["chat", "a1", "a2"]);
    assert_eq!(demand_names(&table, "qwen"), ["qwen", "q1"]);
    let owner = |d: &ModelDeployment| {
        owners.get(&(d.metadata.namespace.clone().unwrap(), d.metadata.name.clone().unwrap())).cloned()
    };
    let target =
        |name: &str| activation_target(&table, name, &ds, owner).map(|(d, m)| (d.metadata.name.clone().unwrap(), m));
    assert_eq!(target("a2"), Some(("canary".into(), "chat".into())), "the deployment that declares it");
    assert_eq!(target("a1"), Some(("stable".into(), "chat".into())), "the oldest, which the table routes it to");
    assert_eq!(target("chat"), Some(("stable".into(), "chat".into())));
    assert_eq!(target("q1"), Some(("qwen".into(), "qwen".into())));
    assert_eq!(target("nope"), None);
}
