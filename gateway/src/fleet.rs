//! The routing table as the control cluster describes it, as a pure function: InferenceClusters
//! (entry URL, region, jurisdiction, readiness) and ModelDeployments (model name, aliases,
//! sovereignty, fallbacks, routing weight, per-cluster Ready replicas from status, LoRA adapters
//! through `adapters`) go in; a [`TableFile`] and the problems that kept parts of it out come out. One bad object never empties the table:
//! it is left out and named, and the rest routes.

use std::collections::{BTreeMap, HashMap};

use flotilla_apis::cluster::InferenceCluster;
use flotilla_apis::common::SecretRef;
use flotilla_apis::constants::condition;
use flotilla_apis::deployment::ModelDeployment;
use kube::ResourceExt;

use crate::adapters;
use crate::member::{Material, SCHEMES, UpstreamToken, normalise_url};
use crate::split::{self, Holder};
use crate::table::{ClusterSpec, Deployment, ModelSpec, RouteSpec, TableFile};

/// ModelDeployment (namespace, name) → the model name it serves in the table.
pub type Owners = BTreeMap<(String, String), String>;

/// Reads one key of a Secret: `(namespace from the reference, name, key)` → its bytes, or what
/// is wrong (no such Secret or key, a namespace the gateway does not read).
pub type SecretReader<'a> = &'a dyn Fn(Option<&str>, &str, &str) -> Result<Vec<u8>, String>;

/// What the InferenceCluster's `spec.endpointAuth` Secrets hold for the gateway.
fn material(c: &InferenceCluster, secret: SecretReader<'_>) -> Result<Material, String> {
    let Some(auth) = &c.spec.endpoint_auth else { return Ok(Material::default()) };
    let read = |r: &SecretRef, key: &str, field: &str| {
        secret(r.namespace.as_deref(), &r.name, key).map_err(|e| format!("{field} (Secret {}, key {key}): {e}", r.name))
    };
    let mut m = Material::default();
    if let Some(r) = &auth.token_secret_ref {
        let bytes = read(r, r.key.as_deref().unwrap_or("token"), "tokenSecretRef")?;
        let text = String::from_utf8(bytes).map_err(|_| "tokenSecretRef: the token is not UTF-8".to_string())?;
        m.token = Some(UpstreamToken::parse(&text).map_err(|e| format!("tokenSecretRef (Secret {}): {e}", r.name))?);
    }
    if let Some(r) = &auth.ca_secret_ref {
        m.ca_pem = Some(read(r, r.key.as_deref().unwrap_or("ca.crt"), "caSecretRef")?);
    }
    if let Some(r) = &auth.client_cert_secret_ref {
        m.client_cert_pem = Some(read(r, "tls.crt", "clientCertSecretRef")?);
        m.client_key_pem = Some(read(r, "tls.key", "clientCertSecretRef")?);
    }
    Ok(m)
}

/// The table for the fleet, which deployment serves each model, and what was left out and why.
/// `secret` reads the Secrets that InferenceClusters' `spec.endpointAuth` names.
pub fn table_file(
    clusters: &[InferenceCluster],
    deployments: &[ModelDeployment],
    secret: SecretReader<'_>,
) -> (TableFile, Owners, Vec<String>) {
    let mut problems = Vec::new();
    let mut owners = Owners::new();
    let mut file = TableFile { clusters: Vec::new(), models: Vec::new() };
    let mut routable: HashMap<String, bool> = HashMap::new();
    let mut sorted: Vec<&InferenceCluster> = clusters.iter().collect();
    sorted.sort_by_key(|c| c.name_any());
    for c in sorted {
        let name = c.name_any();
        let Some(url) = c.spec.endpoint.as_deref() else {
            routable.insert(name, false);
            continue;
        };
        let url = match normalise_url(url, SCHEMES) {
            Ok((url, note)) => {
                problems.extend(note.map(|n| format!("InferenceCluster {name}: spec.endpoint: {n}")));
                url
            }
            Err(e) => {
                problems.push(format!("InferenceCluster {name}: spec.endpoint is not routed: {e}"));
                routable.insert(name, false);
                continue;
            }
        };
        let checked = material(c, secret).and_then(|m| crate::table::cluster_tls(&url, &m).map(|_| m));
        let material = match checked {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("InferenceCluster {name}: spec.endpointAuth: {e}: the cluster is not routed"));
                routable.insert(name, false);
                continue;
            }
        };
        // Ready is written by the controller only on evidence from the member.
        let ready = c.status.as_ref().is_some_and(|s| s.conditions.is_true(condition::READY));
        routable.insert(name.clone(), ready);
        file.clusters.push(ClusterSpec {
            name,
            url,
            jurisdiction: c.spec.jurisdiction.0.clone(),
            region: c.spec.region.clone(),
            token_file: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            material,
        });
    }

    // The oldest deployment of a model name (then namespace/name) owns it and its aliases, alone
    // unless it gives spec.routing.weight: then the deployments of its namespace that give one
    // share it (`split::join`), each route tagged with its deployment.
    let mut live: Vec<&ModelDeployment> =
        deployments.iter().filter(|d| d.metadata.deletion_timestamp.is_none()).collect();
    live.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.namespace().cmp(&b.namespace()))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    // Name, alias or adapter → (the deployment that took it first, the model it names, how it
    // holds it).
    let mut owner = adapters::Names::new();
    let mut adapter_specs = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    // Model name → the namespace of the deployment that took it first (a split stays in it).
    let mut first_namespace: BTreeMap<String, String> = BTreeMap::new();
    for d in live {
        let (ns, dname) = (d.namespace().unwrap_or_default(), d.name_any());
        let who = format!("ModelDeployment {ns}/{dname}");
        let model = &d.spec.model;
        let weight = d.spec.routing.as_ref().and_then(|r| r.weight).map(|w| w.max(0).unsigned_abs());
        let at = match owner.get(&model.name) {
            None => {
                let holder = if weight.is_some() { Holder::Split } else { Holder::Alone };
                owner.insert(model.name.clone(), (who.clone(), model.name.clone(), holder));
                first_namespace.insert(model.name.clone(), ns.clone());
                file.models.push(ModelSpec {
                    name: model.name.clone(),
                    aliases: Vec::new(),
                    sovereignty: Default::default(),
                    fallbacks: Vec::new(),
                    routes: Vec::new(),
                    deployments: Vec::new(),
                    scale_to_zero: false,
                    parent: None,
                });
                index.insert(model.name.clone(), file.models.len() - 1);
                file.models.len() - 1
            }
            Some((first, _, holder)) => match split::join(
                &model.name,
                &who,
                weight,
                first,
                *holder,
                first_namespace.get(&model.name) == Some(&ns),
            ) {
                Ok(()) => match index.get(&model.name) {
                    Some(at) => *at,
                    None => continue,
                },
                Err(problem) => {
                    problems.push(problem);
                    continue;
                }
            },
        };
        owners.insert((ns.clone(), dname.clone()), model.name.clone());
        let spec = &mut file.models[at];
        for a in &model.aliases {
            match owner.get(a) {
                // Another deployment of the same split already gave it.
                Some((first, m, h)) if *m == model.name && *first != who && *h != Holder::Adapter => {}
                Some((first, _, _)) => problems.push(format!(
                    "{who}: alias `{a}` is already a name or alias of {first}: the alias is not routed; remove it from spec.model.aliases"
                )),
                None => {
                    owner.insert(a.clone(), (who.clone(), model.name.clone(), Holder::Alias));
                    spec.aliases.push(a.clone());
                }
            }
        }
        // Held while a replica starts when any deployment of the name may scale to zero.
        let to_zero = d.spec.autoscaling.as_ref().is_some_and(|a| a.min_replicas == 0);
        spec.scale_to_zero |= to_zero;
        for f in d.spec.routing.iter().flat_map(|r| &r.fallback_models) {
            if !spec.fallbacks.contains(f) {
                spec.fallbacks.push(f.clone());
            }
        }
        let sovereignty = d.spec.placement.sovereignty.clone().unwrap_or_default();
        let deployment = weight.map(|weight| {
            let name = format!("{ns}/{dname}");
            spec.deployments.push(Deployment { name: name.clone(), weight, sovereignty: sovereignty.clone() });
            name
        });
        if deployment.is_none() {
            spec.sovereignty = sovereignty.clone();
        }
        let mut ready: BTreeMap<&str, i32> = BTreeMap::new();
        // Replicas still serving the previous spec during a rollout are routed to as well.
        for p in d.status.iter().flat_map(|s| &s.placements) {
            *ready.entry(p.cluster.as_str()).or_default() += p.ready.max(p.serving).max(0);
        }
        let routes: Vec<RouteSpec> = ready
            .into_iter()
            .filter(|(c, n)| *n > 0 && routable.get(*c).copied().unwrap_or(false))
            .map(|(c, n)| RouteSpec {
                cluster: c.to_string(),
                weight: n.unsigned_abs(),
                ready: true,
                continuation: None,
                deployment: deployment.clone(),
                member_route: Some(format!("{ns}/{dname}")),
            })
            .collect();
        spec.routes.extend(routes.iter().cloned());
        // Each adapter routes only to this deployment's routes, never to another of a split name.
        let base = adapters::Base {
            who: &who,
            model: &model.name,
            policy: &sovereignty,
            routes: &routes,
            weight,
            scale_to_zero: to_zero,
        };
        adapter_specs.extend(adapters::specs(d, &base, &file.clusters, &mut owner, &mut problems));
    }
    file.models.extend(adapter_specs);
    // A split name as a whole may be served wherever one of its deployments may (each route
    // stays bound by its own deployment's policy).
    for m in file.models.iter_mut().filter(|m| !m.deployments.is_empty()) {
        let policies: Vec<&flotilla_apis::common::Sovereignty> = m.deployments.iter().map(|d| &d.sovereignty).collect();
        m.sovereignty = split::hull(&policies);
        if m.deployments.iter().all(|d| d.weight == 0) {
            problems.push(format!(
                "model `{}`: every deployment serving it has spec.routing.weight 0: requests for it get 503; give one a weight above 0",
                m.name
            ));
        }
    }
    // Fallbacks must name served models (never an adapter: another fine-tuning would answer); an
    // unknown one is dropped, not fatal.
    let is_adapter = |f: &String| owner.get(f).is_some_and(|(_, _, h)| *h == Holder::Adapter);
    for m in &mut file.models {
        let (keep, drop): (Vec<String>, Vec<String>) =
            m.fallbacks.drain(..).partition(|f| owner.contains_key(f) && !is_adapter(f) && f != &m.name);
        for f in drop {
            let why = if is_adapter(&f) {
                "is a LoRA adapter, and a fallback is a model"
            } else {
                "is not a model served by the fleet (or is the model itself)"
            };
            problems.push(format!("model `{}`: fallback `{f}` {why}: it is skipped", m.name));
        }
        m.fallbacks = keep;
    }
    file.models.sort_by(|a, b| a.name.cmp(&b.name));
    (file, owners, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RoutingTable;

    fn cluster(name: &str, juris: &str, ready: bool, endpoint: Option<&str>) -> InferenceCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
            "metadata": {"name": name},
            "spec": {"provider": {"static": {"site": "lab"}}, "region": format!("{}-1", juris.to_lowercase()),
                     "jurisdiction": juris, "endpoint": endpoint, "pools": []},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "X",
                        "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    fn deployment(ns: &str, name: &str, model: &str, created: &str, ready: &[(&str, i32)]) -> ModelDeployment {
        let placements: Vec<_> = ready
            .iter()
            .map(|(c, r)| {
                serde_json::json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand",
                                              "fallbackRank": 1, "desired": r, "ready": r})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": {"model": {"name": model, "aliases": ["alias"], "source": "hf://o/m"}, "replicas": 2,
                     "engine": {"image": "vllm"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]},
                     "placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}},
                     "routing": {"fallbackModels": ["nope"]}},
            "status": {"placements": placements}
        }))
        .unwrap()
    }

    fn no_secrets(_: Option<&str>, name: &str, _: &str) -> Result<Vec<u8>, String> {
        Err(format!("no Secret {name}"))
    }

    #[test]
    fn endpoint_auth_secrets_become_the_clusters_material_and_a_missing_one_keeps_it_out() {
        let mut with = cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"));
        with.spec.endpoint_auth =
            serde_json::from_value(serde_json::json!({"tokenSecretRef": {"name": "eu1-engine"}})).unwrap();
        let mut other_key = cluster("eu2", "EU", true, Some("http://10.0.0.2:8000"));
        other_key.spec.endpoint_auth =
            serde_json::from_value(serde_json::json!({"tokenSecretRef": {"name": "eu2-engine", "key": "api-key"}}))
                .unwrap();
        let mut missing = cluster("eu3", "EU", true, Some("http://10.0.0.3:8000"));
        missing.spec.endpoint_auth =
            serde_json::from_value(serde_json::json!({"tokenSecretRef": {"name": "nope"}})).unwrap();
        let secrets = |ns: Option<&str>, name: &str, key: &str| -> Result<Vec<u8>, String> {
            match (ns, name, key) {
                (None, "eu1-engine", "token") => Ok(b"sekrit-1\n".to_vec()),
                (None, "eu2-engine", "api-key") => Ok(b"sekrit-2".to_vec()),
                _ => Err(format!("no Secret {name} with key {key}")),
            }
        };
        let d = deployment("a", "llama", "llama", "2026-01-01T00:00:00Z", &[("eu1", 1), ("eu2", 1), ("eu3", 1)]);
        let (file, _, problems) = table_file(&[with, other_key, missing], &[d], &secrets);
        let token = |n: &str| file.clusters.iter().find(|c| c.name == n).map(|c| c.material.token.clone());
        assert_eq!(token("eu1"), Some(Some(UpstreamToken::parse("sekrit-1").unwrap())));
        assert_eq!(token("eu2"), Some(Some(UpstreamToken::parse("sekrit-2").unwrap())));
        assert_eq!(token("eu3"), None, "left out");
        let routes: Vec<&str> = file.models[0].routes.iter().map(|r| r.cluster.as_str()).collect();
        assert_eq!(routes, ["eu1", "eu2"]);
        let p = problems.iter().find(|p| p.contains("eu3")).unwrap();
        assert!(p.contains("tokenSecretRef") && p.contains("nope") && p.contains("not routed"), "{p}");
        assert!(!format!("{file:?}").contains("sekrit"), "the token is never printed");
    }

    #[test]
    fn tls_secrets_are_checked_per_cluster_and_a_bad_one_keeps_only_that_cluster_out() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap().pem();
        let auth = |secret: &str| serde_json::from_value(serde_json::json!({"caSecretRef": {"name": secret}})).unwrap();
        let mut good = cluster("eu1", "EU", true, Some("https://inference.eu1.example:443/v1"));
        good.spec.endpoint_auth = auth("fleet-ca");
        let mut garbage = cluster("eu2", "EU", true, Some("https://inference.eu2.example"));
        garbage.spec.endpoint_auth = auth("garbage");
        let mut plain = cluster("eu3", "EU", true, Some("http://10.0.0.3:8000"));
        plain.spec.endpoint_auth = auth("fleet-ca");
        let mut elsewhere = cluster("eu4", "EU", true, Some("https://inference.eu4.example"));
        elsewhere.spec.endpoint_auth =
            serde_json::from_value(serde_json::json!({"clientCertSecretRef": {"name": "gw", "namespace": "other"}}))
                .unwrap();
        let secrets = |ns: Option<&str>, name: &str, key: &str| -> Result<Vec<u8>, String> {
            match (ns, name, key) {
                (Some(other), _, _) => {
                    Err(format!("the gateway reads upstream Secrets only in namespace gw, not {other}"))
                }
                (None, "fleet-ca", "ca.crt") => Ok(ca.clone().into_bytes()),
                (None, "garbage", "ca.crt") => Ok(b"not a certificate".to_vec()),
                _ => Err("no such Secret".into()),
            }
        };
        let d = deployment(
            "a",
            "llama",
            "llama",
            "2026-01-01T00:00:00Z",
            &[("eu1", 1), ("eu2", 1), ("eu3", 1), ("eu4", 1)],
        );
        let (file, _, problems) = table_file(&[good, garbage, plain, elsewhere], &[d], &secrets);
        let routes: Vec<&str> = file.models[0].routes.iter().map(|r| r.cluster.as_str()).collect();
        assert_eq!(routes, ["eu1"], "{problems:?}");
        let eu1 = &file.clusters[0];
        assert_eq!(
            (eu1.url.as_str(), eu1.material.ca_pem.as_deref()),
            ("https://inference.eu1.example:443", Some(ca.as_bytes()))
        );
        let problem = |n: &str| {
            problems.iter().find(|p| p.contains(&format!("InferenceCluster {n}:"))).cloned().unwrap_or_default()
        };
        assert!(problem("eu2").contains("CA bundle"), "{problems:?}");
        assert!(problem("eu3").contains("use https://"), "{problems:?}");
        assert!(problem("eu4").contains("clientCertSecretRef") && problem("eu4").contains("not other"), "{problems:?}");
        // The whole table still loads, TLS client of eu1 included.
        let table = RoutingTable::from_file("fleet", file).unwrap();
        assert!(table.clusters().next().unwrap().tls.is_some());
    }

    #[test]
    fn routes_only_ready_replicas_on_ready_clusters_with_a_usable_entry() {
        let clusters = [
            cluster("eu1", "EU", true, Some("http://10.0.0.1:8000")),
            cluster("eu2", "EU", false, Some("http://10.0.0.2:8000")),
            cluster("eu3", "EU", true, None),
            cluster("eu4", "EU", true, Some("grpc://tls:443")),
            cluster("eu5", "EU", true, Some("http://10.0.0.5:8000")),
            cluster("eu6", "EU", true, Some("http://10.0.0.6:8000/v1/")),
            cluster("eu7", "EU", true, Some("http://10.0.0.7:8000/v1/chat/completions")),
        ];
        let d = deployment(
            "a",
            "llama",
            "llama",
            "2026-01-01T00:00:00Z",
            &[("eu1", 2), ("eu2", 1), ("eu3", 1), ("eu4", 1), ("eu5", 0), ("eu6", 1), ("eu7", 1)],
        );
        let (file, owners, problems) = table_file(&clusters, &[d], &no_secrets);
        assert_eq!(owners.get(&("a".to_string(), "llama".to_string())).map(String::as_str), Some("llama"));
        let routes: Vec<(&str, u32)> = file.models[0].routes.iter().map(|r| (r.cluster.as_str(), r.weight)).collect();
        assert_eq!(routes, [("eu1", 2), ("eu6", 1)]);
        // Each names its ModelDeployment to the member's routing (x-flotilla-deployment).
        assert!(file.models[0].routes.iter().all(|r| r.member_route.as_deref() == Some("a/llama")));
        assert!(
            problems.iter().any(|p| p.contains("eu4") && p.contains("must start with http:// or https://")),
            "{problems:?}"
        );
        // A `/v1` suffix (as LiteLLM's api_base is written) is dropped and said so; an API path is refused.
        let eu6 = file.clusters.iter().find(|c| c.name == "eu6").unwrap();
        assert_eq!(eu6.url, "http://10.0.0.6:8000");
        assert!(problems.iter().any(|p| p.contains("eu6") && p.contains("ends in /v1")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("eu7") && p.contains("API path")), "{problems:?}");
        assert!(!file.clusters.iter().any(|c| c.name == "eu7"));
        assert!(problems.iter().any(|p| p.contains("fallback `nope`")), "{problems:?}");
        let table = RoutingTable::from_file("fleet", file).unwrap();
        let m = table.resolve("alias").unwrap();
        assert_eq!(m.sovereignty.allowed_jurisdictions[0].0, "EU");
    }

    #[test]
    fn replicas_still_serving_the_previous_spec_are_routed_during_a_rollout() {
        let clusters = [cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"))];
        let mut d = deployment("a", "llama", "llama", "2026-01-01T00:00:00Z", &[("eu1", 0)]);
        // None ready on the new spec yet, 2 serving on the old one.
        if let Some(p) = d.status.as_mut().and_then(|s| s.placements.first_mut()) {
            (p.desired, p.serving) = (2, 2);
        }
        let (file, _, _) = table_file(&clusters, std::slice::from_ref(&d), &no_secrets);
        let routes: Vec<(&str, u32)> = file.models[0].routes.iter().map(|r| (r.cluster.as_str(), r.weight)).collect();
        assert_eq!(routes, [("eu1", 2)]);
    }

    #[test]
    fn a_deployment_that_may_scale_to_zero_stays_in_the_table_at_zero_and_says_so() {
        let clusters = [cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"))];
        let mut d = deployment("a", "llama", "llama", "2026-01-01T00:00:00Z", &[]);
        d.spec.replicas = 0;
        let (file, _, _) = table_file(&clusters, std::slice::from_ref(&d), &no_secrets);
        assert_eq!((file.models[0].routes.len(), file.models[0].scale_to_zero), (0, false), "listed, not held");
        d.spec.autoscaling = serde_json::from_value(
            serde_json::json!({"minReplicas": 0, "maxReplicas": 2, "target": {"queuedPerReplica": 4}}),
        )
        .unwrap();
        let (file, _, _) = table_file(&clusters, std::slice::from_ref(&d), &no_secrets);
        assert_eq!((file.models[0].name.as_str(), file.models[0].scale_to_zero), ("llama", true));
        assert!(file.models[0].routes.is_empty());
        let table = RoutingTable::from_file("fleet", file).unwrap();
        assert!(table.resolve("llama").unwrap().scale_to_zero);
    }

    #[test]
    fn the_oldest_deployment_owns_a_name_and_deleting_drops_it() {
        let clusters = [cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"))];
        let old = deployment("b", "old", "llama", "2026-01-01T00:00:00Z", &[("eu1", 1)]);
        let new = deployment("a", "new", "llama", "2026-02-01T00:00:00Z", &[("eu1", 3)]);
        let (file, owners, problems) = table_file(&clusters, &[new.clone(), old.clone()], &no_secrets);
        assert_eq!(
            owners.keys().collect::<Vec<_>>(),
            [&("b".to_string(), "old".to_string())],
            "only the older one owns it"
        );
        assert_eq!(file.models.len(), 1);
        assert_eq!(file.models[0].routes[0].weight, 1, "the older deployment serves");
        assert!(problems.iter().any(|p| p.contains("ModelDeployment a/new") && p.contains("already served")));
        let mut gone = old;
        gone.metadata.deletion_timestamp = new.metadata.creation_timestamp.clone();
        let (file, _, _) = table_file(&clusters, &[gone], &no_secrets);
        assert!(file.models.is_empty(), "a deployment being deleted gets no new traffic");
    }
}
