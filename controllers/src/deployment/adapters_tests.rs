use flotilla_apis::cache::CachePhase;
use serde_json::json;

use super::*;

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn place(jurisdiction: &str, region: &str, labels: &[(&str, &str)]) -> Place {
    let mut labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    labels.insert("flotilla.dev/region".into(), region.into());
    labels.insert("flotilla.dev/jurisdiction".into(), jurisdiction.into());
    Place { jurisdiction: jurisdiction.into(), region: region.into(), labels }
}

fn adapter(name: &str, cache: &str, policy: serde_json::Value) -> Adapter {
    let mut a = json!({"name": name, "cacheRef": cache});
    if let serde_json::Value::Object(m) = policy {
        for (k, v) in m {
            a[k] = v;
        }
    }
    serde_json::from_value(a).unwrap()
}

/// A cache with `spec.digest` and the given phase per cluster (Ready ones with that digest).
fn staged(phases: &[(&str, CachePhase)]) -> AdapterCache {
    AdapterCache {
        digest: Some(DIGEST.into()),
        clusters: phases
            .iter()
            .map(|(c, p)| {
                let seen = (*p == CachePhase::Ready).then(|| DIGEST.to_string());
                (c.to_string(), (*p, seen, None))
            })
            .collect(),
    }
}

/// `support-fr` (EU only, cache `fr`) and `sql` (anywhere, cache `sql`) of `ml/chat`, with eu1
/// (EU), us1 (US) and eu2 (EU, labelled `tier: basic`); both caches Ready in every cluster.
fn view() -> AdapterView {
    AdapterView {
        deployment: "ml/chat".into(),
        adapters: vec![
            adapter("support-fr", "fr", json!({"sovereignty": {"allowedJurisdictions": ["EU"]}})),
            adapter("sql", "sql", json!({})),
        ],
        base: Sovereignty::default(),
        caches: BTreeMap::from([
            (
                "fr".to_string(),
                staged(&[("eu1", CachePhase::Ready), ("eu2", CachePhase::Ready), ("us1", CachePhase::Ready)]),
            ),
            (
                "sql".to_string(),
                staged(&[("eu1", CachePhase::Ready), ("eu2", CachePhase::Ready), ("us1", CachePhase::Ready)]),
            ),
        ]),
        places: BTreeMap::from([
            ("eu1".to_string(), place("EU", "eu-central-1", &[("tier", "premium")])),
            ("eu2".to_string(), place("EU", "eu-west-3", &[("tier", "basic")])),
            ("us1".to_string(), place("US", "us-east-1", &[("tier", "premium")])),
        ]),
    }
}

fn waiting(s: &AdapterStatus) -> Vec<(&str, AdapterWaitReason)> {
    s.waiting.iter().map(|w| (w.cluster.as_str(), w.reason)).collect()
}

#[test]
fn an_eu_only_adapter_is_served_in_the_eu_and_outside_policy_elsewhere_even_when_staged_there() {
    let v = view();
    let s = v.statuses(["us1", "eu1", "eu2", "eu1"]);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].name, "support-fr");
    assert_eq!(s[0].clusters, ["eu1", "eu2"], "sorted, each once");
    assert_eq!(waiting(&s[0]), [("us1", AdapterWaitReason::OutsidePolicy)]);
    assert!(s[0].waiting[0].message.contains("jurisdiction US"), "{}", s[0].waiting[0].message);
    assert!(s[0].waiting[0].message.contains("[EU]"), "{}", s[0].waiting[0].message);
    assert_eq!((s[1].name.as_str(), s[1].clusters.len(), s[1].waiting.len()), ("sql", 3, 0));
    // What replicas may load follows the same check.
    assert_eq!(v.loadable("us1").iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["sql"]);
    assert_eq!(v.loadable("eu1").iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["support-fr", "sql"]);
}

#[test]
fn the_deployments_policy_narrows_every_adapter_and_the_selector_narrows_further() {
    let mut v = view();
    v.base = Sovereignty { denied_regions: vec!["eu-west-3".into()], ..Default::default() };
    v.adapters[1].cluster_selector = Some(serde_json::from_value(json!({"matchLabels": {"tier": "premium"}})).unwrap());
    v.places.insert("eu3".into(), place("EU", "eu-north-1", &[("tier", "basic")]));
    v.caches.get_mut("sql").unwrap().clusters.insert("eu3".into(), (CachePhase::Ready, Some(DIGEST.into()), None));
    let s = v.statuses(["eu1", "eu2", "eu3", "us1"]);
    assert_eq!(s[0].clusters, ["eu1"]);
    assert_eq!(
        waiting(&s[0]),
        [
            ("eu2", AdapterWaitReason::OutsidePolicy),
            ("eu3", AdapterWaitReason::CacheNotReady),
            ("us1", AdapterWaitReason::OutsidePolicy)
        ]
    );
    assert!(s[0].waiting[0].message.contains("eu-west-3 is denied"), "{}", s[0].waiting[0].message);
    assert_eq!(s[1].clusters, ["eu1", "us1"]);
    assert_eq!(waiting(&s[1]), [("eu2", AdapterWaitReason::OutsidePolicy), ("eu3", AdapterWaitReason::OutsidePolicy)]);
    assert!(s[1].waiting[0].message.contains("eu-west-3 is denied"), "{}", s[1].waiting[0].message);
    assert!(s[1].waiting[1].message.contains("clusterSelector"), "{}", s[1].waiting[1].message);
    // An unknown cluster cannot be checked: never served there.
    assert_eq!(v.check(&v.adapters[1], "gone").unwrap_err().0, AdapterWaitReason::OutsidePolicy);
    // A selector that cannot be evaluated leaves every cluster out.
    v.adapters[1].cluster_selector = Some(
        serde_json::from_value(json!({"matchExpressions": [{"key": "tier", "operator": "Near", "values": ["x"]}]}))
            .unwrap(),
    );
    assert!(v.loadable("eu1").iter().all(|a| a.name != "sql"));
}

#[test]
fn a_cache_missing_unverified_or_not_ready_keeps_the_adapter_waiting_with_what_to_change() {
    let mut v = view();
    v.caches.remove("sql");
    let (reason, message) = v.check(&v.adapters[1], "eu1").unwrap_err();
    assert_eq!(reason, AdapterWaitReason::CacheNotFound);
    assert!(message.contains("no ModelCache ml/sql"), "{message}");

    let mut unverified = staged(&[("eu1", CachePhase::Ready)]);
    unverified.digest = None;
    v.caches.insert("sql".into(), unverified);
    let (reason, message) = v.check(&v.adapters[1], "eu1").unwrap_err();
    assert_eq!(reason, AdapterWaitReason::CacheUnverified);
    assert!(message.contains("spec.digest"), "{message}");

    let mut cache =
        staged(&[("eu1", CachePhase::Downloading), ("eu2", CachePhase::Failed), ("us1", CachePhase::Ready)]);
    cache.clusters.get_mut("eu2").unwrap().2 = Some("DigestMismatch".into());
    // Ready with another digest than the spec's (the spec's changed; not verified again yet).
    cache.clusters.get_mut("us1").unwrap().1 = Some("sha256:old".into());
    v.caches.insert("sql".into(), cache);
    v.places.insert("eu3".into(), place("EU", "eu-north-1", &[]));
    let s = v.statuses(["eu1", "eu2", "us1", "eu3"]);
    assert!(s[1].clusters.is_empty(), "{:?}", s[1]);
    let all: Vec<(&str, AdapterWaitReason)> = waiting(&s[1]);
    assert!(all.iter().all(|(_, r)| *r == AdapterWaitReason::CacheNotReady), "{all:?}");
    let msg = |c: &str| s[1].waiting.iter().find(|w| w.cluster == c).unwrap().message.clone();
    assert!(msg("eu1").contains("Downloading"), "{}", msg("eu1"));
    assert!(msg("eu2").contains("DigestMismatch"), "{}", msg("eu2"));
    assert!(msg("us1").contains("sha256:old"), "{}", msg("us1"));
    assert!(msg("eu3").contains("spec.targets.deployments") && msg("eu3").contains("chat"), "{}", msg("eu3"));
    // A policy refusal comes first, whatever the cache: the EU-only adapter says OutsidePolicy in
    // us1 even with its cache gone.
    v.caches.remove("fr");
    assert_eq!(v.check(&v.adapters[0], "us1").unwrap_err().0, AdapterWaitReason::OutsidePolicy);
    assert_eq!(v.check(&v.adapters[0], "eu1").unwrap_err().0, AdapterWaitReason::CacheNotFound);
}

#[test]
fn no_adapters_no_status() {
    let v = AdapterView { adapters: Vec::new(), ..view() };
    assert!(v.statuses(["eu1", "us1"]).is_empty());
    assert!(v.loadable("eu1").is_empty());
}
