use flotilla_apis::document::parse_stream;
use flotilla_apis::{FleetObject, InferenceClass};

use super::*;

fn fleet() -> (Vec<ModelDeployment>, BTreeMap<String, InferenceClassSpec>) {
    let mut deployments = Vec::new();
    let mut classes = BTreeMap::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet");
    for file in ["classes.yaml", "deployments/llama-3.3-70b-eu.yaml", "deployments/qwen3-235b-disagg.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for o in parse_stream(file, &text).objects {
            match o.value {
                FleetObject::Deployment(d) => deployments.push(d),
                FleetObject::Class(InferenceClass { metadata, spec, .. }) => {
                    classes.insert(metadata.name.unwrap(), spec);
                }
                _ => {}
            }
        }
    }
    (deployments, classes)
}

fn yaml(objects: &[Value]) -> String {
    objects.iter().map(|o| serde_yaml_ng::to_string(&sorted_keys(o)).unwrap()).collect::<Vec<_>>().join("---\n")
}

/// `replicas` of the first example deployment on pool h100, its second alternative.
fn h100<'a>(
    md: &'a ModelDeployment,
    classes: &'a BTreeMap<String, InferenceClassSpec>,
    replicas: i32,
) -> PoolWorkload<'a> {
    PoolWorkload {
        pool: "h100",
        class: &classes["h100-sxm-80g"],
        alternative: &md.spec.devices.alternatives[1],
        replicas,
    }
}

#[test]
fn tensor_parallel_with_dra() {
    let (mds, classes) = fleet();
    let md = &mds[0];
    let w = h100(md, &classes, 2);
    let objects = render(md, &[w], true, None, None, &[]);
    insta::assert_snapshot!("tensor_parallel_dra", yaml(&objects));
    // The claim template carries the solver's selector and the class identity.
    let rct = &objects[0];
    let exprs: Vec<&str> = rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cel"]["expression"].as_str().unwrap())
        .collect();
    assert!(exprs.iter().any(|e| e.contains("memory.compareTo(quantity(\"80Gi\"))")), "{exprs:?}");
    assert!(exprs.iter().any(|e| e.contains("productName == \"NVIDIA H100 80GB HBM3\"")), "{exprs:?}");
}

#[test]
fn extended_resources_without_dra_and_generation_only_on_objects() {
    let (mds, classes) = fleet();
    let mut md = mds[0].clone();
    md.metadata.generation = Some(7);
    let w = PoolWorkload {
        pool: "h100",
        class: &classes["h100-sxm-80g"],
        alternative: &md.spec.devices.alternatives[0],
        replicas: 3,
    };
    let objects = render(&md, &[w], false, None, None, &[]);
    let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Deployment", "PodDisruptionBudget", "Service"], "no claim template");
    let dep = &objects[0];
    assert_eq!(dep["spec"]["replicas"], 3);
    assert_eq!(dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "4");
    assert_eq!(dep["metadata"]["labels"]["flotilla.dev/generation"], "7");
    assert!(
        dep["spec"]["template"]["metadata"]["labels"].get("flotilla.dev/generation").is_none(),
        "pods must not roll on a new generation"
    );
    assert_eq!(dep["spec"]["template"]["spec"]["nodeSelector"]["flotilla.dev/pool"], "h100");
    // Packed like the solver counts: toward the nodes running the pool's Flotilla pods, of
    // every deployment and namespace, one node at a time.
    let pref =
        &dep["spec"]["template"]["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(pref.as_array().map(Vec::len), Some(1), "{pref}");
    let term = &pref[0]["podAffinityTerm"];
    assert_eq!(pref[0]["weight"], 100);
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["namespaceSelector"], serde_json::json!({}), "every namespace");
    assert_eq!(
        term["labelSelector"],
        serde_json::json!({"matchLabels": {"app.kubernetes.io/managed-by": "flotilla", "flotilla.dev/pool": "h100"}}),
        "Flotilla's pods of this pool, not only this deployment's"
    );
    assert!(
        dep["spec"]["template"]["spec"]["affinity"].get("podAntiAffinity").is_none()
            && dep["spec"]["template"]["spec"]["affinity"].get("nodeAffinity").is_none(),
        "a preference only"
    );
}

#[test]
fn disaggregated_roles_become_deployments() {
    let (mds, classes) = fleet();
    let md = &mds[1];
    let w = PoolWorkload {
        pool: "h100",
        class: &classes["h100-sxm-80g"],
        alternative: &md.spec.devices.alternatives[0],
        replicas: 2,
    };
    let objects = render(md, &[w], false, None, None, &[]);
    insta::assert_snapshot!("disaggregated", yaml(&objects));
    let names: Vec<String> = objects
        .iter()
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            "Deployment/qwen3-235b-disagg-h100-prefill",
            "Deployment/qwen3-235b-disagg-h100-decode",
            "PodDisruptionBudget/qwen3-235b-disagg-h100",
            "Service/qwen3-235b-disagg"
        ]
    );
    assert_eq!(objects[1]["spec"]["replicas"], 4, "2 replicas x 2 decode pods");
    // One budget over both roles' pods (a replica is one prefill and two decode pods): the
    // example's 50% of 2 replicas is 1 replica, so 1 pod may be evicted at a time.
    let pdb = &objects[2];
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"].get("minAvailable").is_none());
    let selector = &pdb["spec"]["selector"]["matchLabels"];
    assert!(selector.get("flotilla.dev/role").is_none(), "every role: {selector}");
    for role in [&objects[0], &objects[1]] {
        let pod = &role["spec"]["template"]["metadata"]["labels"];
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(&pod[k], v, "the {k} of every role's pods is selected");
        }
    }
}

#[test]
fn multi_node_becomes_a_leader_worker_set() {
    let (mds, classes) = fleet();
    let mut md = mds[0].clone();
    md.spec.topology =
        serde_json::from_value(serde_json::json!({"type": "MultiNode", "devicesPerReplica": 8, "nodesPerReplica": 2}))
            .unwrap();
    let w = PoolWorkload {
        pool: "h100",
        class: &classes["h100-sxm-80g"],
        alternative: &md.spec.devices.alternatives[0],
        replicas: 3,
    };
    let objects = render(&md, &[w], false, None, None, &[]);
    insta::assert_snapshot!("multi_node_lws", yaml(&objects));
    let lws = &objects[0];
    assert_eq!(lws["kind"], "LeaderWorkerSet");
    // 3 groups of 2 pods, default budget of 1 replica: 1 pod at a time.
    assert_eq!(objects[1]["kind"], "PodDisruptionBudget");
    assert_eq!(objects[1]["spec"]["maxUnavailable"], 1);
    assert_eq!(
        objects[1]["spec"]["selector"]["matchLabels"],
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"],
        "leaders and workers alike"
    );
    assert_eq!(lws["spec"]["replicas"], 3);
    assert_eq!(lws["spec"]["leaderWorkerTemplate"]["size"], 2);
    assert!(
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"].get("affinity").is_none(),
        "a group's pods are not drawn onto one node"
    );
    assert_eq!(
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "8"
    );
}

#[test]
fn each_pool_gets_a_budget_over_exactly_its_pods() {
    let (mds, classes) = fleet();
    let mut md = mds[0].clone();
    let w = |pool, replicas| PoolWorkload {
        pool,
        class: &classes["h100-sxm-80g"],
        alternative: &mds[0].spec.devices.alternatives[0],
        replicas,
    };
    let budgets = |objects: &[Value]| -> Vec<Value> {
        objects.iter().filter(|o| o["kind"] == "PodDisruptionBudget").cloned().collect()
    };
    let objects = render(&md, &[w("h100", 3), w("h100-spot", 1)], false, None, None, &[]);
    let pdbs = budgets(&objects);
    assert_eq!(pdbs.len(), 2, "one per pool");
    for (pdb, pool) in pdbs.iter().zip(["h100", "h100-spot"]) {
        let dep = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["labels"]["flotilla.dev/pool"] == pool)
            .unwrap();
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["metadata"]["name"], dep["metadata"]["name"], "named like the pool's workload");
        assert_eq!(pdb["spec"]["selector"], dep["spec"]["selector"], "exactly the Deployment's pods");
        assert_eq!(pdb["metadata"]["labels"], dep["metadata"]["labels"], "found, pruned and swept like it");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "the default, also for the pool with one replica");
        assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    }
    // A budget as written: a percentage passes through where a replica is one pod.
    md.spec.disruption_budget = Some(serde_json::from_value(serde_json::json!({"minAvailable": "50%"})).unwrap());
    let pdb = &budgets(&render(&md, &[w("h100", 4)], true, None, None, &[]))[0];
    assert_eq!(pdb["spec"]["minAvailable"], "50%");
    assert!(pdb["spec"].get("maxUnavailable").is_none());
}

#[test]
fn service_names_are_rfc1035_labels() {
    assert_eq!(service_name("gpt-oss-120b"), "gpt-oss-120b", "valid names are kept");
    let dotted = service_name("llama-3.3-70b-eu");
    assert!(dotted.starts_with("llama-3-3-70b-eu-") && dotted.len() == "llama-3-3-70b-eu-".len() + 8, "{dotted}");
    assert_eq!(dotted, "llama-3-3-70b-eu-40eeef70", "what earlier releases wrote: an upgrade renames nothing");
    assert_ne!(dotted, service_name("llama-3-3-70b-eu"), "a dot and a dash do not collide");
    assert!(service_name("3b-model").starts_with("m-3b-model-"));
    let long = service_name(&"a.".repeat(100));
    assert!(long.len() <= 63 && !long.contains('.'), "{long}");
    for n in [dotted, long] {
        assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
    }
}

#[test]
fn workload_names_keep_todays_form_and_are_bounded_when_long() {
    assert_eq!(workload_name("qwen", "h100-spot", None, None), "qwen-h100-spot", "a name that fits is kept");
    assert_eq!(workload_name("qwen", "h100", Some("decode"), None), "qwen-h100-decode");
    let n = "m".repeat(60);
    let a = workload_name(&n, "h100", None, None);
    let b = workload_name(&n, "h100", Some("decode"), None);
    let c = workload_name(&n, "h200", None, None);
    for x in [&a, &b, &c] {
        assert!(x.len() <= MAX_LABEL && x.starts_with("mmmm"), "{x}");
        assert!(x.ends_with(|ch: char| ch.is_ascii_alphanumeric()), "{x}");
    }
    assert!(a != b && a != c && b != c, "pool and role are in the hash: {a} {b} {c}");
    assert_eq!(a, workload_name(&n, "h100", None, None), "stable");
    // What earlier releases wrote: an upgrade renames nothing.
    assert_eq!(a, format!("{}-e0db3b23", "m".repeat(54)));
    // The hash takes the tuple, not the joined string.
    let long = "q".repeat(60);
    assert_ne!(
        workload_name(&long, "h100-spot", None, None),
        workload_name(&format!("{long}-h100"), "spot", None, None)
    );
}

#[test]
fn a_suffix_ends_every_workload_name_and_parts_the_colliding_pair() {
    let plain = workload_name("qwen", "h100-spot", None, None);
    assert_eq!(plain, workload_name("qwen-h100", "spot", None, None), "the join collides");
    let s = "0a1b2c3d";
    assert_eq!(workload_name("qwen-h100", "spot", None, Some(s)), "qwen-h100-spot-0a1b2c3d");
    assert_eq!(workload_name("qwen-h100", "spot", Some("decode"), Some(s)), "qwen-h100-spot-decode-0a1b2c3d");
    let long = "q".repeat(60);
    let (a, b) = (workload_name(&long, "spot", None, Some(s)), workload_name(&long, "spot", None, None));
    assert!(a.len() <= MAX_LABEL && a != b, "{a} {b}");
    // Every object of the pool carries it: the Deployment, its claim template and its budget.
    let (mds, classes) = fleet();
    let md = &mds[0];
    let w = h100(md, &classes, 1);
    let names: Vec<String> = render(md, &[w], true, Some(s), None, &[])
        .iter()
        .filter(|o| o["kind"] != "Service")
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.contains(s)), "{names:?}");
    let mut other = md.clone();
    other.metadata.name = Some("other".into());
    assert_ne!(workload_suffix(md), workload_suffix(&other));
}

#[test]
fn label_values_are_bounded_and_unchanged_when_they_fit() {
    assert_eq!(label_value("ml.llama"), "ml.llama");
    let long = format!("ml.{}", "x".repeat(64));
    let v = label_value(&long);
    assert!(v.len() <= MAX_LABEL && v.starts_with("ml.xxx"), "{v}");
    assert_ne!(v, label_value(&format!("ml.{}", "x".repeat(65))));
    let (fleet, classes) = fleet();
    let mut md = fleet[0].clone();
    md.metadata.name = Some("a".repeat(64));
    let alternative = md.spec.devices.alternatives[1].clone();
    let w = PoolWorkload { pool: "h100", class: &classes["h100-sxm-80g"], alternative: &alternative, replicas: 1 };
    let objects = render(&md, &[w], true, None, None, &[]);
    let tolerations = &objects[1]["spec"]["template"]["spec"]["tolerations"][0]["value"];
    assert!(tolerations.as_str().unwrap().len() <= MAX_LABEL, "{tolerations}");
    for o in &objects {
        let name = o["metadata"]["name"].as_str().unwrap();
        // A claim template is `<workload>-gpus`: a DNS subdomain (253), kept so that no pod
        // template changes for names that already fit.
        let max = if o["kind"] == "ResourceClaimTemplate" { MAX_LABEL + 5 } else { MAX_LABEL };
        assert!(name.len() <= max, "{name}");
        for (k, v) in o["metadata"]["labels"].as_object().unwrap() {
            assert!(v.as_str().unwrap().len() <= MAX_LABEL, "{k}={v}");
        }
    }
}

#[test]
fn a_member_gateway_gets_one_route_to_the_deployments_service_by_its_own_header() {
    let (mds, classes) = fleet();
    let md = &mds[0];
    let gateway = GatewayRef { namespace: "edge".into(), name: "inference".into(), section_name: Some("http".into()) };
    let objects = render(md, &[h100(md, &classes, 2)], true, None, Some(&gateway), &[]);
    insta::assert_snapshot!("http_route", yaml(&objects[objects.len() - 1..]));
    let routes: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "HTTPRoute").collect();
    assert_eq!(routes.len(), 1, "one route per deployment and member, whatever its pools");
    let (route, service) = (routes[0], objects.iter().find(|o| o["kind"] == "Service").unwrap());
    assert_eq!(route["metadata"]["namespace"], service["metadata"]["namespace"]);
    assert_eq!(route["metadata"]["labels"], service["metadata"]["labels"], "owned and pruned like the Service");
    let ns = md.metadata.namespace.as_deref().unwrap();
    let header = &route["spec"]["rules"][0]["matches"][0]["headers"][0];
    assert_eq!(header["name"], DEPLOYMENT_HEADER);
    // The value's namespace is the route's own: member routers refuse any other.
    assert_eq!(header["value"], format!("{ns}/{}", md.metadata.name.as_deref().unwrap()));
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["name"], service["metadata"]["name"]);
    assert_eq!(backend["port"], service["spec"]["ports"][0]["port"]);
    assert!(backend.get("namespace").is_none(), "never another namespace's Service");
    assert_eq!(route["spec"]["parentRefs"][0]["sectionName"], "http");
    assert_eq!(route["metadata"]["annotations"][annotations::MODEL], md.spec.model.name.as_str());
    // Without a member gateway, no route: the endpoint routes by itself.
    let plain = render(md, &[h100(md, &classes, 2)], true, None, None, &[]);
    assert!(plain.iter().all(|o| o["kind"] != "HTTPRoute"));
}

/// The first example deployment with two adapters: `support-fr` (EU only, cache
/// `support-fr-lora`) and `sql` (cache `sql-lora`).
fn with_adapters() -> (ModelDeployment, BTreeMap<String, InferenceClassSpec>) {
    let (mds, classes) = fleet();
    let mut md = mds[0].clone();
    md.spec.adapters = serde_json::from_value(serde_json::json!([
        {"name": "support-fr", "cacheRef": "support-fr-lora", "sovereignty": {"allowedJurisdictions": ["EU"]}},
        {"name": "sql", "cacheRef": "sql-lora"}
    ]))
    .unwrap();
    (md, classes)
}

fn engine(objects: &[Value]) -> &Value {
    &objects.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]["containers"][0]
}

fn route(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()
}

#[test]
fn loadable_adapters_are_mounted_read_only_and_listed_on_the_route() {
    let (md, classes) = with_adapters();
    let gateway = GatewayRef { namespace: "edge".into(), name: "inference".into(), section_name: None };
    let all: Vec<&flotilla_apis::deployment::Adapter> = md.spec.adapters.iter().collect();
    let objects = render(&md, &[h100(&md, &classes, 2)], true, None, Some(&gateway), &all);
    let c = engine(&objects);
    let args = strings(&c["args"]);
    assert_eq!(args[args.len() - 2..], ["--enable-lora", "--max-loras=4"], "after the user's: {args:?}");
    assert!(
        c["env"].as_array().unwrap().iter().any(|e| e["name"] == RUNTIME_LORA_ENV && e["value"] == "True"),
        "{}",
        c["env"]
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    let dirs: Vec<&str> = mounts.iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
    assert_eq!(dirs, ["/models/llama-3.3-70b", "/adapters/support-fr-lora", "/adapters/sql-lora"], "the model's kept");
    assert!(mounts.iter().all(|m| m["readOnly"] == true), "{mounts:?}");
    let pod = &objects.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 3);
    for (m, v) in mounts.iter().zip(volumes) {
        assert_eq!(m["name"], v["name"]);
        assert_eq!(v["persistentVolumeClaim"]["readOnly"], true);
    }
    assert_eq!(volumes[1]["persistentVolumeClaim"]["claimName"], crate::cache::render::pvc_name("support-fr-lora"));
    let notes = &route(&objects)["metadata"]["annotations"];
    let listed: BTreeMap<String, String> =
        serde_json::from_str(notes[annotations::ADAPTERS].as_str().unwrap()).unwrap();
    assert_eq!(
        listed,
        BTreeMap::from([
            ("sql".to_string(), "/adapters/sql-lora".to_string()),
            ("support-fr".to_string(), "/adapters/support-fr-lora".to_string())
        ])
    );
    assert_eq!(notes[annotations::MAX_ADAPTERS], "4");
}

#[test]
fn an_adapter_not_loadable_in_a_member_leaves_no_trace_there_and_the_engine_flags_do_not_change() {
    let (md, classes) = with_adapters();
    let gateway = GatewayRef { namespace: "edge".into(), name: "inference".into(), section_name: None };
    // What the caller passes for a US member: the EU-only adapter is outside its policy there.
    let us: Vec<&flotilla_apis::deployment::Adapter> = md.spec.adapters.iter().filter(|a| a.name == "sql").collect();
    let objects = render(&md, &[h100(&md, &classes, 2)], true, None, Some(&gateway), &us);
    let text = serde_json::to_string(&objects).unwrap();
    assert!(!text.contains("support-fr"), "{text}");
    assert!(text.contains("/adapters/sql-lora"));
    // Nothing loadable yet (still staging): no adapter mount, no list; the model's mount stays.
    let none = render(&md, &[h100(&md, &classes, 2)], true, None, Some(&gateway), &[]);
    let c = engine(&none);
    assert_eq!(c["volumeMounts"].as_array().map(Vec::len), Some(1), "{}", c["volumeMounts"]);
    let notes = &route(&none)["metadata"]["annotations"];
    assert!(notes.get(annotations::ADAPTERS).is_none(), "{notes}");
    assert_eq!(notes[annotations::MAX_ADAPTERS], "4");
    // The engine's flags come from the spec alone: staging finishing changes only the mounts.
    assert_eq!((&c["args"], &c["env"]), (&engine(&objects)["args"], &engine(&objects)["env"]));
}

#[test]
fn the_users_lora_flags_win_and_a_deployment_without_adapters_gets_none() {
    let (mut md, classes) = with_adapters();
    md.spec.engine.args = vec!["--enable_lora".into(), "--max-loras".into(), "2".into()];
    md.spec
        .engine
        .env
        .push(serde_json::from_value(serde_json::json!({"name": RUNTIME_LORA_ENV, "value": "False"})).unwrap());
    let c = engine(&render(&md, &[h100(&md, &classes, 1)], true, None, None, &[])).clone();
    assert_eq!(strings(&c["args"]), ["--enable_lora", "--max-loras", "2"], "nothing added");
    let set: Vec<&Value> = c["env"].as_array().unwrap().iter().filter(|e| e["name"] == RUNTIME_LORA_ENV).collect();
    assert_eq!(set, [&serde_json::json!({"name": RUNTIME_LORA_ENV, "value": "False"})]);
    // engine.maxLoadedAdapters is the engine's --max-loras and the route's max-adapters.
    md.spec.engine.args.clear();
    md.spec.engine.max_loaded_adapters = Some(8);
    let gateway = GatewayRef { namespace: "edge".into(), name: "inference".into(), section_name: None };
    let objects = render(&md, &[h100(&md, &classes, 1)], true, None, Some(&gateway), &[]);
    assert_eq!(strings(&engine(&objects)["args"]), ["--enable-lora", "--max-loras=8"]);
    assert_eq!(route(&objects)["metadata"]["annotations"][annotations::MAX_ADAPTERS], "8");
    // Twin: without adapters, the engine and route are as they always were.
    md.spec.adapters.clear();
    md.spec.engine.env.retain(|e| e.name != RUNTIME_LORA_ENV);
    let objects = render(&md, &[h100(&md, &classes, 1)], true, None, Some(&gateway), &[]);
    let text = serde_json::to_string(&objects).unwrap();
    assert!(!text.contains("lora") && !text.contains("LORA") && !text.contains("adapters"), "{text}");
}

#[test]
fn adapter_volumes_are_dns_labels() {
    assert_eq!(adapter_volume("sql-lora"), "adapter-sql-lora");
    for cache in ["support.fr.v2", &"x".repeat(200)] {
        let v = adapter_volume(cache);
        assert!(v.len() <= MAX_LABEL && v.starts_with("adapter-"), "{v}");
        assert!(v.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{v}");
    }
    assert_ne!(adapter_volume("support.fr"), adapter_volume("support-fr"));
}
