//! Tests of the weighted split: the choice (deterministic, proportional, sticky, weight 0 and
//! unavailable deployments get nothing), the table's deployments, the fleet's rule for who
//! shares a name (unchanged without weights), and what `Serving` says about shares.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::RoutingTable;
use crate::pick::prefix_key;

const YAML: &str = r#"
clusters:
  - {name: eu1, url: "http://127.0.0.1:1", jurisdiction: EU, region: eu-central-1}
  - {name: eu2, url: "http://127.0.0.1:2", jurisdiction: EU, region: eu-west-3}
  - {name: us1, url: "http://127.0.0.1:3", jurisdiction: US, region: us-east-1}
models:
  - name: chat
    deployments:
      - {name: ml/stable, weight: 90}
      - {name: ml/canary, weight: 10, sovereignty: {allowedJurisdictions: [EU]}}
      - {name: ml/drained, weight: 0}
    routes:
      - {cluster: eu1, deployment: ml/stable}
      - {cluster: us1, deployment: ml/stable}
      - {cluster: eu2, deployment: ml/canary}
      - {cluster: us1, deployment: ml/canary}
      - {cluster: eu2, deployment: ml/drained}
  - name: plain
    routes: [{cluster: eu1}, {cluster: eu2}]
"#;

/// The deployment and clusters a request with `key` may go to, given the clusters it tried.
fn split(t: &RoutingTable, model: &str, key: u64, tried: &[&str]) -> (String, Vec<String>) {
    let m = t.resolve(model).unwrap();
    let routes = t.allowed_routes(m, &[&m.sovereignty]);
    let idx: Vec<usize> = (0..routes.len()).collect();
    let kept = narrow(m, &routes, idx, |i| tried.contains(&routes[i].cluster.name.as_str()), key);
    let dep = kept.first().and_then(|&i| m.deployments.get(routes[i].deployment)).map(|d| d.name.clone());
    (dep.unwrap_or_default(), kept.iter().map(|&i| routes[i].cluster.name.clone()).collect())
}

#[test]
fn a_request_goes_to_one_deployment_and_only_where_that_deployment_may_serve() {
    let t = RoutingTable::from_yaml("t", YAML).unwrap();
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for k in 0..2000u64 {
        let key = prefix_key(&format!("user {k}: summarise this"), 256).unwrap();
        let (dep, clusters) = split(&t, "chat", key, &[]);
        match dep.as_str() {
            "ml/stable" => assert_eq!(clusters, ["eu1", "us1"]),
            // The canary is EU-only: its route to us1 is never offered, the stable's is.
            "ml/canary" => assert_eq!(clusters, ["eu2"]),
            other => panic!("deployment {other:?} chosen"),
        }
        assert_eq!(split(&t, "chat", key, &[]).0, dep, "the same key, the same deployment");
        *seen.entry(dep).or_default() += 1;
    }
    assert!(!seen.contains_key("ml/drained"), "weight 0 takes nothing");
    let canary = f64::from(seen["ml/canary"]) / 2000.0;
    assert!((canary - 0.10).abs() < 0.025, "canary share {canary}");
    // A model that is not split is untouched.
    assert_eq!(split(&t, "plain", 7, &[]).1, ["eu1", "eu2"]);
}

#[test]
fn a_deployment_without_ready_routes_gets_no_share_and_a_spent_one_hands_over() {
    let not_ready =
        YAML.replace("{cluster: eu2, deployment: ml/canary}", "{cluster: eu2, deployment: ml/canary, ready: false}");
    let t = RoutingTable::from_yaml("t", &not_ready).unwrap();
    for k in 0..500u64 {
        assert_eq!(split(&t, "chat", k, &[]).0, "ml/stable", "key {k}: the canary has no ready route");
    }
    // Without the stable's routes the canary's weight is all there is.
    let t = RoutingTable::from_yaml("t", YAML).unwrap();
    let key = (0..).find(|k| split(&t, "chat", *k, &[]).0 == "ml/stable").unwrap();
    // One of its clusters tried: the same deployment still (`pick` prefers its untried cluster).
    assert_eq!(split(&t, "chat", key, &["eu1"]), ("ml/stable".into(), vec!["eu1".into(), "us1".into()]));
    assert_eq!(split(&t, "chat", key, &["eu1", "us1"]), ("ml/canary".into(), vec!["eu2".into()]));
    // Every route tried: the key's own deployment again (a retry of the same cluster is `pick`'s call).
    assert_eq!(split(&t, "chat", key, &["eu1", "us1", "eu2"]).0, "ml/stable");
}

#[test]
fn the_table_checks_deployments_with_the_field_named() {
    let err = |yaml: String| RoutingTable::from_yaml("t", &yaml).unwrap_err().to_string();
    let e = err(YAML.replace("{cluster: eu1, deployment: ml/stable}", "{cluster: eu1}"));
    assert!(e.contains("model `chat` is split") && e.contains("`deployment`"), "{e}");
    let e = err(YAML.replace("{cluster: eu1, deployment: ml/stable}", "{cluster: eu1, deployment: ml/nope}"));
    assert!(e.contains("unknown deployment `ml/nope`"), "{e}");
    let e = err(YAML.replace("routes: [{cluster: eu1}", "routes: [{cluster: eu1, deployment: x}"));
    assert!(e.contains("model `plain`") && e.contains("lists no `deployments`"), "{e}");
    let e = err(YAML.replace("{name: ml/drained, weight: 0}", "{name: ml/canary, weight: 0}"));
    assert!(e.contains("deployment `ml/canary` is listed twice"), "{e}");
    let e = err(YAML.replace("{cluster: eu2, deployment: ml/drained}", "{cluster: eu2, deployment: ml/canary}"));
    assert!(e.contains("cluster `eu2` routed twice"), "{e}");
    let e = err(YAML.replace("weight: 90}", "weight: 90, share: 1}"));
    assert!(e.contains("share"), "{e}");
}

#[test]
fn choose_is_rendezvous_an_option_leaving_moves_only_its_keys() {
    let three = [("a", 50), ("b", 30), ("c", 20)];
    let two = [("a", 50), ("b", 30)];
    for k in 0..5000u64 {
        let key = crate::pick::hash(1, &k.to_le_bytes());
        let was = choose(&three, key).unwrap();
        let now = choose(&two, key).unwrap();
        if was != 2 {
            assert_eq!(was, now, "key {k} moved although its option stayed");
        }
    }
    assert_eq!(choose(&[("a", 0)], 1), None);
    assert_eq!(choose(&[], 1), None);
}

#[test]
fn the_split_key_is_the_prefix_only_under_prefix_affinity() {
    assert_eq!(key(RoutingMode::Prefix, Some(42), 1), 42);
    assert_ne!(key(RoutingMode::Prefix, None, 1), key(RoutingMode::Prefix, None, 2));
    assert_eq!(key(RoutingMode::LeastLoad, Some(42), 1), key(RoutingMode::RoundRobin, None, 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Each deployment with a weight above 0 receives weight / sum of the keys (within 2.5
    /// points over 8,000 keys), a deployment of weight 0 none, and a key always the same one.
    #[test]
    fn the_split_is_proportional_and_deterministic(weights in prop::collection::vec(0u32..=1000, 1..5)) {
        let names: Vec<String> = (0..weights.len()).map(|i| format!("ns/d{i}")).collect();
        let options: Vec<(&str, u32)> = names.iter().map(String::as_str).zip(weights.iter().copied()).collect();
        let total: u32 = weights.iter().sum();
        let mut got = vec![0u32; weights.len()];
        const N: u64 = 8000;
        for k in 0..N {
            let key = crate::pick::hash(9, &k.to_le_bytes());
            match choose(&options, key) {
                Some(i) => {
                    prop_assert_eq!(choose(&options, key), Some(i));
                    got[i] += 1;
                }
                None => prop_assert_eq!(total, 0),
            }
        }
        for (i, w) in weights.iter().enumerate() {
            if *w == 0 {
                prop_assert_eq!(got[i], 0);
            } else {
                let want = f64::from(*w) / f64::from(total);
                let share = f64::from(got[i]) / N as f64;
                prop_assert!((share - want).abs() < 0.025, "deployment {} weight {} of {}: {}", i, w, total, share);
            }
        }
    }

    /// The hull allows every cluster one of the policies allows.
    #[test]
    fn the_hull_allows_what_any_policy_allows(
        a in prop::collection::vec(0usize..3, 0..3), b in prop::collection::vec(0usize..3, 0..3),
        ra in prop::collection::vec(0usize..4, 0..3), da in prop::collection::vec(0usize..4, 0..2),
        db in prop::collection::vec(0usize..4, 0..2),
    ) {
        let j = ["EU", "US", "APAC"];
        let r = ["r0", "r1", "r2", "r3"];
        let pol = |js: &[usize], rs: &[usize], ds: &[usize]| Sovereignty {
            allowed_jurisdictions: js.iter().map(|i| flotilla_apis::common::JurisdictionCode(j[*i].into())).collect(),
            allowed_regions: rs.iter().map(|i| r[*i].to_string()).collect(),
            denied_regions: ds.iter().map(|i| r[*i].to_string()).collect(),
        };
        let (pa, pb) = (pol(&a, &ra, &da), pol(&b, &[], &db));
        let h = hull(&[&pa, &pb]);
        for jur in j {
            for reg in r {
                if pa.allows(jur, reg) || pb.allows(jur, reg) {
                    prop_assert!(h.allows(jur, reg), "{} {} {:?}", jur, reg, h);
                }
            }
        }
    }
}

#[test]
fn serving_reports_the_share_rounded_and_why_there_is_none() {
    assert_eq!(bucket(0.897), 90);
    assert_eq!(bucket(0.874), 85);
    assert_eq!(bucket(0.103), 10);
    assert_eq!(bucket(0.031), 3);
    assert_eq!(
        share_text("chat", 90, 100, 897, 1000, true),
        "; receives about 90 % of the traffic for `chat` over the last minute (weight 90 of 100)"
    );
    assert_eq!(share_text("chat", 90, 100, 902, 1000, true), share_text("chat", 90, 100, 889, 1000, true));
    assert!(share_text("chat", 10, 100, 1, 5, true).contains("too few requests"));
    assert!(share_text("chat", 10, 100, 0, 500, false).contains("goes to the other deployments"));
    assert!(share_text("chat", 0, 100, 0, 500, true).contains("spec.routing.weight is 0"));
    // From the window of answers per deployment.
    let t = RoutingTable::from_yaml("t", YAML).unwrap();
    let m = t.resolve("chat").unwrap();
    let (shares, now) = (Stats::default(), Instant::now());
    for i in 0..40 {
        let d = if i % 4 == 0 { "ml/canary" } else { "ml/stable" };
        shares.record("chat", d, Some(std::time::Duration::from_millis(5)), now);
    }
    let note = share_note(m, "ml/canary", true, &shares, now).unwrap();
    assert!(note.contains("about 25 %") && note.contains("weight 10 of 100"), "{note}");
    assert_eq!(share_note(t.resolve("plain").unwrap(), "ml/canary", true, &shares, now), None);
}

#[test]
fn join_keeps_the_oldest_rule_without_weights_and_names_the_field() {
    let j = |weight, holder| join("chat", "ModelDeployment ml/new", weight, "ModelDeployment ml/old", holder, true);
    assert_eq!(j(Some(10), Holder::Split), Ok(()));
    for (weight, holder) in
        [(None, Holder::Alone), (Some(10), Holder::Alone), (None, Holder::Split), (Some(1), Holder::Alias)]
    {
        let e = j(weight, holder).unwrap_err();
        assert!(e.starts_with("ModelDeployment ml/new: model name `chat`") && e.contains("not routed"), "{e}");
        if holder != Holder::Alias {
            assert!(e.contains("spec.routing.weight"), "{e}");
        }
    }
}

#[test]
fn a_split_never_crosses_namespaces() {
    // Both give a weight, which within one namespace joins the split: from another namespace it
    // never does, whatever the weights.
    for weight in [Some(10), Some(0), None] {
        let e = join("chat", "ModelDeployment other/thief", weight, "ModelDeployment ml/old", Holder::Split, false)
            .unwrap_err();
        assert!(e.contains("in another namespace") && e.contains("not routed"), "{e}");
    }
    assert_eq!(join("chat", "ModelDeployment ml/new", Some(10), "ModelDeployment ml/old", Holder::Split, true), Ok(()));
}

mod fleet {
    use flotilla_apis::cluster::InferenceCluster;
    use flotilla_apis::deployment::ModelDeployment;
    use serde_json::json;

    use crate::RoutingTable;
    use crate::fleet::table_file;

    fn cluster(name: &str, juris: &str, region: &str) -> InferenceCluster {
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
            "spec": {"provider": {"static": {"site": "lab"}}, "region": region, "jurisdiction": juris,
                     "endpoint": format!("http://{name}.example:8000"), "pools": []},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "X", "message": "m",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    fn md(name: &str, created: &str, weight: Option<i32>, on: &str, juris: &str) -> ModelDeployment {
        md_in("ml", name, created, weight, on, juris)
    }

    fn md_in(ns: &str, name: &str, created: &str, weight: Option<i32>, on: &str, juris: &str) -> ModelDeployment {
        let routing = match weight {
            Some(w) => json!({"weight": w}),
            None => json!({}),
        };
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": {"model": {"name": "chat", "aliases": ["chat-latest"], "source": "hf://o/m"}, "replicas": 1,
                     "engine": {"image": "vllm"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]},
                     "placement": {"sovereignty": {"allowedJurisdictions": [juris]}}, "routing": routing},
            "status": {"placements": [{"cluster": on, "pool": "p", "class": "h100", "capacityType": "on-demand",
                                       "fallbackRank": 1, "desired": 1, "ready": 1}]}
        }))
        .unwrap()
    }

    fn no_secrets(_: Option<&str>, name: &str, _: &str) -> Result<Vec<u8>, String> {
        Err(format!("no Secret {name}"))
    }

    fn clusters() -> [InferenceCluster; 2] {
        [cluster("eu1", "EU", "eu-central-1"), cluster("us1", "US", "us-east-1")]
    }

    #[test]
    fn deployments_that_all_give_a_weight_share_the_name_each_with_its_routes_and_policy() {
        let stable = md("stable", "2026-01-01T00:00:00Z", Some(90), "eu1", "EU");
        let canary = md("canary", "2026-02-01T00:00:00Z", Some(10), "us1", "US");
        let (file, owners, problems) = table_file(&clusters(), &[canary, stable], &no_secrets);
        assert!(problems.iter().all(|p| !p.contains("chat-latest") && !p.contains("already")), "{problems:?}");
        assert_eq!(owners.len(), 2, "both deployments serve, so both get Serving");
        let m = &file.models[0];
        let deps: Vec<(&str, u32)> = m.deployments.iter().map(|d| (d.name.as_str(), d.weight)).collect();
        assert_eq!(deps, [("ml/stable", 90), ("ml/canary", 10)], "oldest first");
        let routes: Vec<(&str, Option<&str>)> =
            m.routes.iter().map(|r| (r.cluster.as_str(), r.deployment.as_deref())).collect();
        assert_eq!(routes, [("eu1", Some("ml/stable")), ("us1", Some("ml/canary"))]);
        assert_eq!(m.aliases, ["chat-latest"], "an alias both give is the split's, once");
        let juris: Vec<&str> = m.sovereignty.allowed_jurisdictions.iter().map(|j| j.as_str()).collect();
        assert_eq!(juris, ["EU", "US"], "the name as a whole: the hull");
        let t = RoutingTable::from_file("fleet", file).unwrap();
        let m = t.resolve("chat-latest").unwrap();
        assert_eq!(t.allowed_routes(m, &[&m.sovereignty]).len(), 2);
    }

    #[test]
    fn without_weights_the_oldest_serves_alone_and_a_half_weighted_name_says_which_field_to_set() {
        let old = md("old", "2026-01-01T00:00:00Z", None, "eu1", "EU");
        let new = md("new", "2026-02-01T00:00:00Z", None, "us1", "US");
        let (file, owners, problems) = table_file(&clusters(), &[new.clone(), old.clone()], &no_secrets);
        assert_eq!(owners.keys().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["old"]);
        assert!(file.models[0].deployments.is_empty() && file.models[0].routes.len() == 1);
        assert_eq!(file.models[0].routes[0].deployment, None);
        assert!(
            problems.iter().any(|p| p.contains("ml/new") && p.contains("already served by ModelDeployment ml/old"))
        );

        // The oldest gives no weight, the newer one does: still the oldest alone.
        let weighted_new = md("new", "2026-02-01T00:00:00Z", Some(10), "us1", "US");
        let (file, owners, problems) = table_file(&clusters(), &[weighted_new, old], &no_secrets);
        assert_eq!(owners.len(), 1);
        assert!(file.models[0].deployments.is_empty());
        let p = problems.iter().find(|p| p.contains("ml/new")).unwrap();
        assert!(p.contains("set spec.routing.weight on ModelDeployment ml/old"), "{p}");

        // The oldest gives a weight, the newer one does not: the newer one is left out.
        let weighted_old = md("old", "2026-01-01T00:00:00Z", Some(100), "eu1", "EU");
        let (file, owners, problems) = table_file(&clusters(), &[new, weighted_old], &no_secrets);
        assert_eq!(owners.keys().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["old"]);
        assert_eq!(file.models[0].deployments.len(), 1);
        let p = problems.iter().find(|p| p.contains("ml/new")).unwrap();
        assert!(p.contains("gives no spec.routing.weight") && p.contains("not routed"), "{p}");
    }

    #[test]
    fn a_tenant_naming_another_namespaces_split_model_gets_none_of_its_traffic() {
        // ml splits `chat` 90/10 between stable and canary; a deployment in namespace `other`
        // names the same model with a weight of 1000 and an alias of the split's.
        let stable = md("stable", "2026-01-01T00:00:00Z", Some(90), "eu1", "EU");
        let canary = md("canary", "2026-02-01T00:00:00Z", Some(10), "eu1", "EU");
        let thief = md_in("other", "thief", "2026-03-01T00:00:00Z", Some(1000), "us1", "US");
        let (file, owners, problems) = table_file(&clusters(), &[thief, canary, stable], &no_secrets);
        let m = &file.models[0];
        let deps: Vec<&str> = m.deployments.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(deps, ["ml/stable", "ml/canary"], "the other namespace's deployment is not in the split");
        assert!(m.routes.iter().all(|r| r.cluster == "eu1"), "no route to the thief's cluster: {:?}", m.routes);
        assert!(!owners.keys().any(|(ns, _)| ns == "other"), "it gets no Serving of the name");
        let p = problems.iter().find(|p| p.contains("other/thief")).unwrap();
        assert!(p.contains("in another namespace") && p.contains("give it another spec.model.name"), "{p}");
        let juris: Vec<&str> = m.sovereignty.allowed_jurisdictions.iter().map(|j| j.as_str()).collect();
        assert_eq!(juris, ["EU"], "the name's hull is not widened by the other namespace's policy");
    }

    #[test]
    fn a_name_whose_every_weight_is_zero_is_reported() {
        let a = md("a", "2026-01-01T00:00:00Z", Some(0), "eu1", "EU");
        let b = md("b", "2026-02-01T00:00:00Z", Some(0), "us1", "US");
        let (file, _, problems) = table_file(&clusters(), &[a, b], &no_secrets);
        assert!(problems.iter().any(|p| p.contains("model `chat`") && p.contains("weight 0")), "{problems:?}");
        let t = RoutingTable::from_file("fleet", file).unwrap();
        let m = t.resolve("chat").unwrap();
        assert!(t.allowed_routes(m, &[&m.sovereignty]).is_empty(), "no route takes traffic");
    }
}
