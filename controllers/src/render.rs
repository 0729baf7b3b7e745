//! Rendering what a member cluster runs for one ModelDeployment: per assigned pool a
//! Deployment (one per role for disaggregated serving, a LeaderWorkerSet for multi-node
//! replicas) and its PodDisruptionBudget (`render_budget.rs`), a DRA `ResourceClaimTemplate` carrying the class identity and the same CEL
//! selectors the solver used (or `nvidia.com/gpu` limits where the member has no DRA), and one
//! Service. A deployment with `cacheRef` mounts the cache's volume read-only at
//! `/models/<cache>` (also in `FLOTILLA_MODEL_DIR`). A deployment with `adapters` starts the
//! engine with LoRA on (`--enable-lora`, `--max-loras`, runtime loading allowed: from the spec
//! alone, so nothing rolls when staging finishes elsewhere) and mounts, read-only at
//! `/adapters/<cacheRef>`, the caches of the adapters loadable in this member — those
//! `status.adapters` serves here, never one outside its policy — and lists them on the member's
//! HTTPRoute (`flotilla.dev/adapters`). An adapter newly staged here changes the pod template
//! (one more volume), so the member's replicas roll, one surge at a time within the disruption
//! budget, to pick it up. Pods prefer the nodes that already run
//! the pool's Flotilla pods, so the member's scheduler packs them as the solver counted them
//! (`packing_affinity`). Every object carries the labels that tie it to the deployment, so cleanup can find
//! exactly what Flotilla made and nothing else (the writer adds the installation's and the
//! InferenceCluster's labels: `deployment/members.rs`). Names and label values stay within 63
//! characters: today's when they fit, else shortened with a hash ([`workload_name`],
//! [`label_value`]). Pure: objects as JSON, applied by the caller.

use std::collections::BTreeMap;

use flotilla_apis::ModelDeployment;
use flotilla_apis::cel::{attribute_literal, cel_string};
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::GatewayRef;
use flotilla_apis::constants::{DEPLOYMENT_HEADER, annotations, labels};
use flotilla_apis::deployment::{Adapter, DeviceAlternative, ModelDeploymentSpec, TopologyType};
use serde_json::{Value, json};

use crate::inventory::GPU_RESOURCE;

/// The value of `app.kubernetes.io/managed-by` on everything Flotilla creates.
pub const MANAGED_BY: &str = "flotilla";
/// Default engine port.
pub const DEFAULT_PORT: i32 = 8000;

/// One pool's share of a deployment in one member.
#[derive(Clone, Debug)]
pub struct PoolWorkload<'a> {
    /// Pool name.
    pub pool: &'a str,
    /// The pool's class.
    pub class: &'a InferenceClassSpec,
    /// The device alternative the solver used.
    pub alternative: &'a DeviceAlternative,
    /// Replicas to run here.
    pub replicas: i32,
}

/// The deployment label value: the [`owner_key`] of `md` (`<namespace>.<name>`, bounded).
pub fn deployment_key(md: &ModelDeployment) -> String {
    owner_key(md.metadata.namespace.as_deref().unwrap_or("default"), md.metadata.name.as_deref().unwrap_or(""))
}

use flotilla_apis::fnv::fnv1a64;
pub use flotilla_apis::names::{MAX_LABEL, label_value};
use flotilla_apis::names::{fnv, owner_key, shorten};

/// The name of a deployment's workload in one pool (and role): `<name>-<pool>[-<role>]` as it
/// always was when that has at most 63 characters, else shortened with a hash of the
/// (name, pool, role) tuple. Names that would collide across the deployments of a namespace
/// (`qwen` + `h100-spot` and `qwen-h100` + `spot`) are told apart by `suffix`, which the younger
/// deployment carries ([`workload_suffix`], `deployment/naming.rs`): `<name>-<pool>[-<role>]-<suffix>`.
pub fn workload_name(name: &str, pool: &str, role: Option<&str>, suffix: Option<&str>) -> String {
    let mut full = match role {
        Some(r) => format!("{name}-{pool}-{r}"),
        None => format!("{name}-{pool}"),
    };
    let mut hashed = vec![name, pool, role.unwrap_or("")];
    if let Some(s) = suffix {
        full = format!("{full}-{s}");
        // Only then: the hash of a long name without a suffix stays what it always was.
        hashed.push(s);
    }
    shorten(&full, MAX_LABEL, &hashed)
}

/// The suffix of a deployment's workload names when they must differ from an older
/// deployment's (`deployment/naming.rs`): eight hex digits, a hash of namespace and name.
pub fn workload_suffix(md: &ModelDeployment) -> String {
    let ns = md.metadata.namespace.as_deref().unwrap_or("default");
    format!("{:08x}", fnv(&["workloads", ns, md.metadata.name.as_deref().unwrap_or("")]))
}

/// The label selector that finds every member object of a deployment.
pub fn selector(md: &ModelDeployment) -> String {
    format!("{}={},{}={MANAGED_BY}", labels::DEPLOYMENT, deployment_key(md), labels::MANAGED_BY)
}

fn object_labels(md: &ModelDeployment, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::MANAGED_BY.to_string(), MANAGED_BY.to_string());
    l.insert(labels::DEPLOYMENT.to_string(), deployment_key(md));
    l.insert(labels::GENERATION.to_string(), md.metadata.generation.unwrap_or(0).to_string());
    l.insert("app.kubernetes.io/name".to_string(), label_value(md.metadata.name.as_deref().unwrap_or_default()));
    for (k, v) in extra {
        l.insert((*k).to_string(), (*v).to_string());
    }
    l
}

/// Pod labels never carry the generation: a new generation must not restart healthy pods.
fn pod_labels(md: &ModelDeployment, pool: &str, role: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::MANAGED_BY.to_string(), MANAGED_BY.to_string());
    l.insert(labels::DEPLOYMENT.to_string(), deployment_key(md));
    l.insert(labels::POOL.to_string(), pool.to_string());
    if let Some(r) = role {
        l.insert("flotilla.dev/role".to_string(), r.to_string());
    }
    l
}

/// Pack the pool's nodes as the solver counts them: each pod prefers the nodes that already run
/// Flotilla's pods of the pool, of any deployment in any namespace (the more, the better), so
/// small replicas fill nodes already in use and whole nodes stay free for the replicas that need
/// them. The solver fits replicas best-fit on each node's free devices; the member's default
/// scheduler would instead spread pods over the emptiest nodes (its scoring ignores device
/// resources) and split the devices a larger replica was counted on. Only a preference: a pod
/// still goes wherever it fits.
fn packing_affinity(pool: &str) -> Value {
    json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {labels::MANAGED_BY: MANAGED_BY, labels::POOL: pool}},
            "namespaceSelector": {},
            "topologyKey": "kubernetes.io/hostname"
        }
    }]}})
}

/// CEL that pins devices to the class: its driver and its identity attributes.
pub fn class_selectors(class: &InferenceClassSpec) -> Vec<String> {
    let d = &class.device;
    let mut out = vec![format!("device.driver == {}", cel_string(&d.driver))];
    for (name, attr) in d.identity_attributes() {
        let (domain, short) = name.rsplit_once('/').unwrap_or((d.driver.as_str(), name.as_str()));
        let lhs = format!("device.attributes[{}].{short}", cel_string(domain));
        let rhs = attribute_literal(attr);
        // Versions compare with compareTo, as DRA's semver values do not support `==`.
        out.push(if attr.version.is_some() {
            format!("{lhs}.compareTo({rhs}) == 0")
        } else {
            format!("{lhs} == {rhs}")
        });
    }
    out
}

/// Everything one member runs for a deployment, in apply order; `suffix` ends every workload
/// name when the deployment carries one ([`workload_name`]); `adapters` are those of
/// `spec.adapters` its replicas may load in this member (`deployment/adapters.rs`).
pub fn render(
    md: &ModelDeployment,
    pools: &[PoolWorkload<'_>],
    dra: bool,
    suffix: Option<&str>,
    gateway: Option<&GatewayRef>,
    adapters: &[&Adapter],
) -> Vec<Value> {
    let name = md.metadata.name.clone().unwrap_or_default();
    let ns = md.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let spec = &md.spec;
    let port = spec.engine.port.unwrap_or(DEFAULT_PORT);
    let mut out = Vec::new();
    for w in pools {
        let units: Vec<(Option<&str>, u32, i32)> = match spec.topology.type_ {
            TopologyType::Disaggregated => spec
                .topology
                .roles
                .iter()
                .map(|r| {
                    let role = match r.name {
                        flotilla_apis::deployment::RoleName::Prefill => "prefill",
                        flotilla_apis::deployment::RoleName::Decode => "decode",
                    };
                    (Some(role), r.devices_per_pod, w.replicas * r.pods as i32)
                })
                .collect(),
            _ => vec![(None, spec.topology.devices_per_replica, w.replicas)],
        };
        for (role, devices, replicas) in units {
            let base = workload_name(&name, w.pool, role, suffix);
            let claim_name = format!("{base}-gpus");
            if dra {
                let mut selectors = class_selectors(w.class);
                selectors.extend(w.alternative.selectors.iter().map(|s| s.0.clone()));
                out.push(json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": claim_name, "namespace": ns, "labels": object_labels(md, &[(labels::POOL, w.pool)])},
                    "spec": {
                        // Claims made from the template carry these labels, so members can tell
                        // the devices Flotilla's replicas hold.
                        "metadata": {"labels": pod_labels(md, w.pool, role)},
                        "spec": {"devices": {"requests": [{
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": w.class.device.driver,
                            "allocationMode": "ExactCount",
                            "count": devices,
                            "selectors": selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect::<Vec<_>>()
                        }
                    }]}}}
                }));
            }
            let mut container = json!({
                "name": "engine",
                "image": spec.engine.image,
                "args": engine_args(spec),
                "env": engine_env(spec),
                "ports": [{"name": "http", "containerPort": port}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5}
            });
            // Nodes a CapacityClaim obtained for this deployment (same namespace and name) are
            // tainted for it; the solver places only this deployment there.
            let mut pod_spec = json!({
                "nodeSelector": {labels::POOL: w.pool},
                "tolerations": [{"key": labels::CLAIM, "operator": "Equal",
                                 "value": owner_key(&kube::ResourceExt::namespace(md).unwrap_or_default(), &kube::ResourceExt::name_any(md)),
                                 "effect": "NoSchedule"}],
                "containers": []
            });
            if dra {
                container["resources"] = json!({"claims": [{"name": "gpus"}]});
                pod_spec["resourceClaims"] = json!([{"name": "gpus", "resourceClaimTemplateName": claim_name}]);
            } else {
                container["resources"] = json!({"limits": {GPU_RESOURCE: devices.to_string()}});
            }
            // The ModelCache's volume, read-only, where the engine finds the staged files; then
            // each loadable adapter's.
            let (mut mounts, mut volumes) = (Vec::new(), Vec::new());
            if let Some(cache) = &spec.model.cache_ref {
                let dir = crate::cache::render::model_dir(cache);
                mounts.push(json!({"name": "model-cache", "mountPath": dir, "readOnly": true}));
                if let Some(env) = container["env"].as_array_mut() {
                    env.push(json!({"name": "FLOTILLA_MODEL_DIR", "value": dir}));
                }
                volumes.push(json!({"name": "model-cache", "persistentVolumeClaim": {
                    "claimName": crate::cache::render::pvc_name(cache), "readOnly": true}}));
            }
            for cache in adapter_caches(adapters) {
                let volume = adapter_volume(cache);
                let dir = crate::cache::render::adapter_dir(cache);
                mounts.push(json!({"name": volume, "mountPath": dir, "readOnly": true}));
                volumes.push(json!({"name": volume, "persistentVolumeClaim": {
                    "claimName": crate::cache::render::pvc_name(cache), "readOnly": true}}));
            }
            if !mounts.is_empty() {
                container["volumeMounts"] = json!(mounts);
                pod_spec["volumes"] = json!(volumes);
            }
            pod_spec["containers"] = json!([container]);
            // A replica of several pods keeps the member scheduler's own choice of nodes.
            if spec.topology.type_ != TopologyType::MultiNode {
                pod_spec["affinity"] = packing_affinity(w.pool);
            }
            let pod_l = pod_labels(md, w.pool, role);
            let template = json!({"metadata": {"labels": pod_l}, "spec": pod_spec});
            let mut meta_extra = vec![(labels::POOL, w.pool)];
            if let Some(r) = role {
                meta_extra.push(("flotilla.dev/role", r));
            }
            if spec.topology.type_ == TopologyType::MultiNode {
                out.push(json!({
                    "apiVersion": "leaderworkerset.x-k8s.io/v1",
                    "kind": "LeaderWorkerSet",
                    "metadata": {"name": base, "namespace": ns, "labels": object_labels(md, &meta_extra)},
                    "spec": {
                        "replicas": replicas,
                        "leaderWorkerTemplate": {
                            "size": spec.topology.nodes_per_replica.unwrap_or(1),
                            "workerTemplate": template
                        }
                    }
                }));
            } else {
                out.push(json!({
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": base, "namespace": ns, "labels": object_labels(md, &meta_extra)},
                    "spec": {
                        "replicas": replicas,
                        "selector": {"matchLabels": pod_labels(md, w.pool, role)},
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                        "template": template
                    }
                }));
            }
        }
        // One budget over the pool's pods, every role's: a replica spans them all.
        out.push(crate::render_budget::pdb(
            md,
            &workload_name(&name, w.pool, None, suffix),
            &ns,
            &object_labels(md, &[(labels::POOL, w.pool)]),
            &pod_labels(md, w.pool, None),
            w.replicas,
        ));
    }
    let mut svc_selector = BTreeMap::new();
    svc_selector.insert(labels::DEPLOYMENT.to_string(), deployment_key(md));
    if spec.topology.type_ == TopologyType::Disaggregated {
        svc_selector.insert("flotilla.dev/role".to_string(), "decode".to_string());
    }
    out.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(&name), "namespace": ns, "labels": object_labels(md, &[])},
        "spec": {"selector": svc_selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}
    }));
    if let Some(gateway) = gateway {
        out.push(http_route(md, &ns, &service_name(&name), port, gateway, adapters));
    }
    out
}

/// vLLM's switch that opens `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`, which member
/// routers load adapters through.
pub const RUNTIME_LORA_ENV: &str = "VLLM_ALLOW_RUNTIME_LORA_UPDATING";

/// Whether `args` give `flag` (`--flag`, `--flag=…`, or with `_` for `-` as vLLM accepts).
fn gives(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a.split('=').next().is_some_and(|k| k.replace('_', "-") == flag))
}

/// The engine's args: the user's, then for a deployment with adapters `--enable-lora` and
/// `--max-loras=<engine.maxLoadedAdapters>`, each unless the user's args give it (theirs win).
fn engine_args(spec: &ModelDeploymentSpec) -> Vec<String> {
    let mut args = spec.engine.args.clone();
    if !spec.adapters.is_empty() {
        if !gives(&args, "--enable-lora") && !gives(&args, "--no-enable-lora") {
            args.push("--enable-lora".into());
        }
        if !gives(&args, "--max-loras") {
            args.push(format!("--max-loras={}", spec.engine.max_loaded_adapters_or_default()));
        }
    }
    args
}

/// The engine's env: the user's, then [`RUNTIME_LORA_ENV`] for a deployment with adapters
/// unless the user sets it.
fn engine_env(spec: &ModelDeploymentSpec) -> Vec<Value> {
    let mut env: Vec<Value> = spec.engine.env.iter().map(|e| json!({"name": e.name, "value": e.value})).collect();
    if !spec.adapters.is_empty() && !spec.engine.env.iter().any(|e| e.name == RUNTIME_LORA_ENV) {
        env.push(json!({"name": RUNTIME_LORA_ENV, "value": "True"}));
    }
    env
}

/// The caches of `adapters`, each once, in their order.
fn adapter_caches<'a>(adapters: &[&'a Adapter]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for a in adapters {
        if !out.contains(&a.cache_ref.as_str()) {
            out.push(&a.cache_ref);
        }
    }
    out
}

/// The pod volume of an adapter's cache: `adapter-<cache>`, a DNS label (a cache name may hold
/// dots and 253 characters: then shortened with a hash of the name).
fn adapter_volume(cache: &str) -> String {
    let plain = format!("adapter-{cache}");
    if plain.len() <= MAX_LABEL && !plain.contains('.') {
        return plain;
    }
    let clean: String = plain.chars().take(MAX_LABEL - 9).map(|c| if c == '.' { '-' } else { c }).collect();
    format!("{}-{:08x}", clean.trim_end_matches('-'), fnv(&["adapter", cache]))
}

/// The `flotilla.dev/adapters` annotation: adapter name → directory, of `adapters`.
fn adapters_annotation(adapters: &[&Adapter]) -> Option<String> {
    let listed: BTreeMap<&str, String> =
        adapters.iter().map(|a| (a.name.as_str(), crate::cache::render::adapter_dir(&a.cache_ref))).collect();
    (!listed.is_empty()).then(|| serde_json::to_string(&listed).unwrap_or_default())
}

/// The member's route to the deployment's Service: requests that name the deployment in
/// [`DEPLOYMENT_HEADER`] (`<namespace>/<name>`, set by the fleet gateway), through the member's
/// Gateway. The header value's namespace is the route's own, so no tenant can route for another.
/// For a deployment with adapters, the member router's part: which it may load here
/// ([`annotations::ADAPTERS`], absent when none) and how many at once
/// ([`annotations::MAX_ADAPTERS`]).
fn http_route(
    md: &ModelDeployment,
    ns: &str,
    service: &str,
    port: i32,
    gateway: &GatewayRef,
    adapters: &[&Adapter],
) -> Value {
    let mut parent = json!({
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "namespace": gateway.namespace,
        "name": gateway.name,
    });
    if let Some(section) = &gateway.section_name {
        parent["sectionName"] = json!(section);
    }
    let who = format!("{ns}/{}", md.metadata.name.as_deref().unwrap_or(""));
    let mut notes = BTreeMap::from([(annotations::MODEL, md.spec.model.name.clone())]);
    if !md.spec.adapters.is_empty() {
        notes.insert(annotations::MAX_ADAPTERS, md.spec.engine.max_loaded_adapters_or_default().to_string());
        if let Some(listed) = adapters_annotation(adapters) {
            notes.insert(annotations::ADAPTERS, listed);
        }
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": service,
            "namespace": ns,
            "labels": object_labels(md, &[]),
            "annotations": notes,
        },
        "spec": {
            "parentRefs": [parent],
            "rules": [{
                "matches": [{"headers": [{"type": "Exact", "name": DEPLOYMENT_HEADER, "value": who}]}],
                "backendRefs": [{"group": "", "kind": "Service", "name": service, "port": port}],
            }],
        }
    })
}

/// `v` with every object's keys in sorted order, whatever serde_json's `preserve_order` (which a
/// workspace test build turns on through the AWS SDK's test utilities): for stable snapshots.
pub fn sorted_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted_keys(&m[k]))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// A Service name (an RFC 1035 label: lower-case letters, digits and `-`, starting with a
/// letter, at most 63 characters) for a ModelDeployment name, which may hold dots
/// (`llama-3.3-70b-eu`). A name that had to change gets a short hash of the original, so two
/// deployments that differ only in a dot never share a Service.
pub fn service_name(name: &str) -> String {
    let mut out: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "m-");
    }
    if out == name && out.len() <= MAX_LABEL && !out.ends_with('-') {
        return out;
    }
    // FNV-1a: stable across versions and platforms, unlike `DefaultHasher`.
    let hash = fnv1a64(name.as_bytes());
    out.truncate(54);
    let out = out.trim_end_matches('-');
    format!("{out}-{:08x}", hash as u32)
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
