//! Tests of `table::build`: the route shape Flotilla renders is served; hostile and foreign
//! routes are not (another namespace's header value, another namespace's Service, another
//! Gateway, a younger duplicate); endpoints follow readiness, ports and address families.

use serde_json::{Value, json};

use super::*;
use crate::member_router::config::GatewayName;

const HDR: &str = "x-flotilla-deployment";

fn gw() -> GatewayName {
    GatewayName::new("flotilla-router", "flotilla")
}

fn route_json(ns: &str, name: &str, created: &str, value: &str, service: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created,
                     "annotations": {"flotilla.dev/model": format!("model-{name}")}},
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "namespace": "flotilla-router", "name": "flotilla", "sectionName": "http"}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"},
                             "headers": [{"type": "Exact", "name": HDR, "value": value}]}],
                "backendRefs": [{"group": "", "kind": "Service", "name": service, "port": 8000}],
            }],
        }
    })
}

fn object(v: Value) -> kube::core::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": v["metadata"], "spec": v["spec"],
    }))
    .unwrap()
}

fn route(v: Value) -> HttpRoute {
    HttpRoute::from_dynamic(&object(v)).unwrap()
}

#[test]
fn a_route_that_cannot_be_read_is_left_out_alone() {
    let good = route_json("team-a", "llama", "2026-01-01T00:00:00Z", "team-a/llama", "llama");
    let mut odd = route_json("team-b", "qwen", "2026-01-01T00:00:00Z", "team-b/qwen", "qwen");
    odd["spec"]["rules"] = json!("not a list");
    let other = route_json("team-c", "elsewhere", "2026-01-01T00:00:00Z", "team-c/elsewhere", "elsewhere");
    let mut other = other;
    other["spec"]["parentRefs"][0]["name"] = json!("another-gateway");
    let objects = [object(odd), object(good), object(other)];
    let (routes, notes) = readable(objects.iter(), &gw());
    let keys: Vec<String> = routes.iter().map(HttpRoute::key).collect();
    assert_eq!(keys, ["team-a/llama"], "the readable route parented here is served, the others are not");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("team-b/qwen") && notes[0].contains("cannot be read"), "{notes:?}");
}

fn simple(ns: &str, name: &str, created: &str, value: &str) -> HttpRoute {
    route(route_json(ns, name, created, value, name))
}

fn service(ns: &str, name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": name}, "ports": [
            {"name": "metrics", "port": 9000, "targetPort": 9000},
            {"name": "http", "port": 8000, "targetPort": "http"},
        ]}
    }))
    .unwrap()
}

/// A slice of `svc` with `(address, ready)` endpoints; `ready: None` leaves the condition out.
fn slice(ns: &str, svc: &str, family: &str, eps: &[(&str, Option<bool>)]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, r)| match r {
            Some(r) => json!({"addresses": [a], "conditions": {"ready": r}}),
            None => json!({"addresses": [a]}),
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{svc}-{family}"), "namespace": ns,
                     "labels": {SERVICE_NAME_LABEL: svc}},
        "addressType": family,
        "endpoints": endpoints,
        "ports": [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8080}],
    }))
    .unwrap()
}

fn run(routes: &[HttpRoute], services: &[Service], slices: &[EndpointSlice]) -> Built {
    build(Inputs { gateway: &gw(), header: HDR, routes, services, slices })
}

fn urls(b: &Built, value: &str) -> Vec<String> {
    b.table.routes[value].endpoints.iter().map(|e| e.url.clone()).collect()
}

#[test]
fn the_rendered_route_is_served_with_its_ready_endpoints_on_the_named_port() {
    let b = run(
        &[simple("team-a", "llama", "2024-01-01T00:00:00Z", "team-a/llama")],
        &[service("team-a", "llama")],
        &[slice("team-a", "llama", "IPv4", &[("10.0.0.1", Some(true)), ("10.0.0.2", None), ("10.0.0.3", Some(false))])],
    );
    assert_eq!(b.notes, Vec::<String>::new());
    assert_eq!(b.table.routes.len(), 1);
    let r = &b.table.routes["team-a/llama"];
    assert_eq!((r.model.as_str(), r.source.as_str()), ("model-llama", "team-a/llama"));
    // Absent `ready` is ready; `false` is not; the Service port 8000 is `http`, 8080 on the pods.
    assert_eq!(urls(&b, "team-a/llama"), ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]);
    assert!(r.endpoints.iter().all(|e| (e.weight - 0.5).abs() < 1e-9));
    assert_eq!(b.table.ready_models(), ["model-llama"]);
}

#[test]
fn a_route_claiming_another_namespaces_value_is_ignored() {
    // Tenant b tries to take tenant a's traffic: the victim keeps it, the thief gets nothing.
    let thief = simple("team-b", "thief", "2020-01-01T00:00:00Z", "team-a/llama");
    let b = run(
        &[thief, simple("team-a", "llama", "2024-01-01T00:00:00Z", "team-a/llama")],
        &[service("team-a", "llama"), service("team-b", "thief")],
        &[
            slice("team-a", "llama", "IPv4", &[("10.0.0.1", None)]),
            slice("team-b", "thief", "IPv4", &[("10.6.6.6", None)]),
        ],
    );
    assert_eq!(urls(&b, "team-a/llama"), ["http://10.0.0.1:8080"]);
    assert_eq!(b.table.routes["team-a/llama"].source, "team-a/llama");
    assert_eq!(b.table.routes.len(), 1, "{:?}", b.table);
    assert!(b.notes.iter().any(|n| n.contains("team-b/thief") && n.contains("outside its own namespace")));
    // Alone, the thief still gets nothing.
    let alone = run(&[simple("team-b", "thief", "2020-01-01T00:00:00Z", "team-a/llama")], &[], &[]);
    assert!(alone.table.routes.is_empty());
}

#[test]
fn malformed_header_values_are_ignored() {
    for v in ["team-a", "team-a/", "team-a/x/y", "/x", "team-ab/x", ""] {
        let b = run(&[simple("team-a", "x", "2024-01-01T00:00:00Z", v)], &[], &[]);
        assert!(b.table.routes.is_empty(), "{v}");
        assert!(!b.notes.is_empty(), "{v}");
    }
}

#[test]
fn a_backend_in_another_namespace_is_not_served() {
    let mut v = route_json("team-b", "x", "2024-01-01T00:00:00Z", "team-b/x", "llama");
    v["spec"]["rules"][0]["backendRefs"][0]["namespace"] = json!("team-a");
    let b = run(
        &[route(v)],
        &[service("team-a", "llama"), service("team-b", "llama")],
        &[slice("team-a", "llama", "IPv4", &[("10.0.0.1", None)])],
    );
    // The route is known (503, not 404), but never reaches team-a's pods.
    assert_eq!(b.table.routes["team-b/x"].endpoints, vec![]);
    assert!(b.notes.iter().any(|n| n.contains("another namespace")));
}

#[test]
fn only_core_services_are_backends() {
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["rules"][0]["backendRefs"] = json!([
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "x", "port": 8000},
        {"kind": "ServiceImport", "name": "y", "port": 8000},
    ]);
    let b = run(&[route(v)], &[service("team-a", "x")], &[slice("team-a", "x", "IPv4", &[("10.0.0.1", None)])]);
    assert!(b.table.routes["team-a/x"].endpoints.is_empty());
    assert_eq!(b.notes.iter().filter(|n| n.contains("only Services")).count(), 2);
}

#[test]
fn the_oldest_route_wins_a_contested_value() {
    let older = route(route_json("team-a", "old", "2024-01-01T00:00:00Z", "team-a/llama", "old"));
    let newer = route(route_json("team-a", "new", "2024-06-01T00:00:00Z", "team-a/llama", "new"));
    let services = [service("team-a", "old"), service("team-a", "new")];
    let slices =
        [slice("team-a", "old", "IPv4", &[("10.0.0.1", None)]), slice("team-a", "new", "IPv4", &[("10.0.0.2", None)])];
    for routes in [[older.clone(), newer.clone()], [newer.clone(), older.clone()]] {
        let b = run(&routes, &services, &slices);
        assert_eq!(b.table.routes["team-a/llama"].source, "team-a/old");
        assert_eq!(urls(&b, "team-a/llama"), ["http://10.0.0.1:8080"]);
        assert!(
            b.notes.iter().any(|n| n.contains("team-a/new also claims") && n.contains("older HTTPRoute team-a/old"))
        );
    }
    // Same age: the name decides, whatever the order seen.
    let a = route(route_json("team-a", "a", "2024-01-01T00:00:00Z", "team-a/llama", "old"));
    let z = route(route_json("team-a", "z", "2024-01-01T00:00:00Z", "team-a/llama", "new"));
    for routes in [[a.clone(), z.clone()], [z.clone(), a.clone()]] {
        assert_eq!(run(&routes, &services, &slices).table.routes["team-a/llama"].source, "team-a/a");
    }
}

#[test]
fn no_route_for_an_httproute_parented_to_another_gateway() {
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["parentRefs"][0]["name"] = json!("istio");
    let other_ns = {
        let mut v = route_json("team-a", "y", "2024-01-01T00:00:00Z", "team-a/y", "x");
        v["spec"]["parentRefs"][0]["namespace"] = json!("elsewhere");
        route(v)
    };
    let other_kind = {
        let mut v = route_json("team-a", "z", "2024-01-01T00:00:00Z", "team-a/z", "x");
        v["spec"]["parentRefs"][0]["kind"] = json!("Service");
        route(v)
    };
    let b = run(&[route(v), other_ns, other_kind], &[service("team-a", "x")], &[]);
    assert!(b.table.routes.is_empty());
    assert!(b.notes.is_empty(), "another Gateway's routes are not ours to comment on: {:?}", b.notes);
    // A parentRef without a namespace means the route's own: a route in the Gateway's namespace.
    let mut v = route_json("flotilla-router", "x", "2024-01-01T00:00:00Z", "flotilla-router/x", "x");
    v["spec"]["parentRefs"] = json!([{"name": "flotilla"}]);
    assert!(run(&[route(v)], &[], &[]).table.routes.contains_key("flotilla-router/x"));
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["parentRefs"] = json!([{"name": "flotilla"}]);
    assert!(run(&[route(v)], &[], &[]).table.routes.is_empty(), "defaults to team-a/flotilla, not ours");
}

#[test]
fn other_match_shapes_are_not_served() {
    let shapes = [
        json!([{"headers": [{"type": "RegularExpression", "name": HDR, "value": "team-a/.*"}]}]),
        json!([{"headers": [{"name": "x-other", "value": "team-a/x"}]}]),
        json!([{"path": {"type": "PathPrefix", "value": "/v1/embeddings"}, "headers": [{"name": HDR, "value": "team-a/x"}]}]),
        json!([{"headers": [{"name": HDR, "value": "team-a/x"}, {"name": "x-b", "value": "1"}]}]),
        json!([{"headers": [{"name": HDR, "value": "team-a/x"}], "method": "GET"}]),
        json!([{"headers": [{"name": HDR, "value": "team-a/x"}]}, {"path": {"value": "/"}}]),
        json!([]),
    ];
    for m in shapes {
        let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
        v["spec"]["rules"][0]["matches"] = m.clone();
        let b = run(&[route(v)], &[], &[]);
        assert!(b.table.routes.is_empty(), "{m}");
        assert!(b.notes.iter().any(|n| n.contains("is not served")), "{m}");
    }
    // Defaults (header type, path) and the header name's case are accepted.
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["rules"][0]["matches"] = json!([{"headers": [{"name": "X-Flotilla-Deployment", "value": "team-a/x"}]}]);
    assert!(run(&[route(v)], &[], &[]).table.routes.contains_key("team-a/x"));
    // A rule with a filter is not served.
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["rules"][0]["filters"] = json!([{"type": "RequestRedirect"}]);
    assert!(run(&[route(v)], &[], &[]).table.routes.is_empty());
}

#[test]
fn ipv6_endpoints_are_bracketed_and_fqdn_slices_skipped() {
    let b = run(
        &[simple("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x")],
        &[service("team-a", "x")],
        &[
            slice("team-a", "x", "IPv6", &[("fd00::1", None)]),
            slice("team-a", "x", "FQDN", &[("engine.example.com", None)]),
        ],
    );
    assert_eq!(urls(&b, "team-a/x"), ["http://[fd00::1]:8080"]);
}

#[test]
fn missing_services_and_ports_give_a_known_route_without_endpoints() {
    let slices = [slice("team-a", "x", "IPv4", &[("10.0.0.1", None)])];
    // No Service.
    let b = run(&[simple("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x")], &[], &slices);
    assert!(b.table.routes["team-a/x"].endpoints.is_empty());
    assert!(b.notes.iter().any(|n| n.contains("not found")));
    assert!(b.table.ready_models().is_empty());
    // A backend port the Service does not have.
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["rules"][0]["backendRefs"][0]["port"] = json!(1234);
    let b = run(&[route(v)], &[service("team-a", "x")], &slices);
    assert!(b.table.routes["team-a/x"].endpoints.is_empty());
    // A slice without the named port but with a single port: that one.
    let mut one: EndpointSlice = slices[0].clone();
    one.ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort { port: Some(7000), ..Default::default() }]);
    let b = run(&[simple("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x")], &[service("team-a", "x")], &[one]);
    assert_eq!(urls(&b, "team-a/x"), ["http://10.0.0.1:7000"]);
    // A slice of another Service is not used.
    let b = run(
        &[simple("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x")],
        &[service("team-a", "x")],
        &[slice("team-a", "y", "IPv4", &[("10.0.0.9", None)]), slice("team-b", "x", "IPv4", &[("10.0.0.8", None)])],
    );
    assert!(b.table.routes["team-a/x"].endpoints.is_empty());
}

#[test]
fn backend_weights_split_over_their_ready_endpoints() {
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["spec"]["rules"][0]["backendRefs"] = json!([
        {"name": "big", "port": 8000, "weight": 3},
        {"name": "small", "port": 8000},
        {"name": "off", "port": 8000, "weight": 0},
    ]);
    let b = run(
        &[route(v)],
        &[service("team-a", "big"), service("team-a", "small"), service("team-a", "off")],
        &[
            slice("team-a", "big", "IPv4", &[("10.0.0.1", None), ("10.0.0.2", None), ("10.0.0.3", Some(false))]),
            slice("team-a", "small", "IPv4", &[("10.0.1.1", None)]),
            slice("team-a", "off", "IPv4", &[("10.0.2.1", None)]),
        ],
    );
    let w: Vec<(String, f64)> =
        b.table.routes["team-a/x"].endpoints.iter().map(|e| (e.url.clone(), e.weight)).collect();
    assert_eq!(
        w,
        [
            ("http://10.0.0.1:8080".to_string(), 1.5),
            ("http://10.0.0.2:8080".to_string(), 1.5),
            ("http://10.0.1.1:8080".to_string(), 1.0)
        ]
    );
}

#[test]
fn an_unannotated_route_is_served_but_not_listed() {
    let mut v = route_json("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x", "x");
    v["metadata"]["annotations"] = json!({});
    let b = run(&[route(v)], &[service("team-a", "x")], &[slice("team-a", "x", "IPv4", &[("10.0.0.1", None)])]);
    assert_eq!(urls(&b, "team-a/x"), ["http://10.0.0.1:8080"]);
    assert!(b.table.ready_models().is_empty());
    assert!(b.notes.iter().any(|n| n.contains("flotilla.dev/model")));
}

#[test]
fn the_same_inputs_give_the_same_notes() {
    let routes = [
        simple("team-b", "thief", "2020-01-01T00:00:00Z", "team-a/llama"),
        simple("team-a", "x", "2024-01-01T00:00:00Z", "team-a/x"),
    ];
    assert_eq!(run(&routes, &[], &[]), run(&routes, &[], &[]));
}

fn annotated(adapters: Option<&str>, max: Option<&str>) -> Built {
    let mut v = route_json("team-a", "llama", "2024-01-01T00:00:00Z", "team-a/llama", "llama");
    if let Some(a) = adapters {
        v["metadata"]["annotations"]["flotilla.dev/adapters"] = json!(a);
    }
    if let Some(m) = max {
        v["metadata"]["annotations"]["flotilla.dev/max-adapters"] = json!(m);
    }
    run(&[route(v)], &[service("team-a", "llama")], &[slice("team-a", "llama", "IPv4", &[("10.0.0.1", None)])])
}

#[test]
fn adapter_annotations_are_read_into_the_route() {
    let b = annotated(Some(r#"{"support-fr": "/adapters/support-fr-lora", "sql": "/adapters/sql"}"#), Some("8"));
    assert_eq!(b.notes, Vec::<String>::new());
    let r = &b.table.routes["team-a/llama"];
    let names: Vec<(&str, &str)> = r.adapters.iter().map(|(n, p)| (n.as_str(), p.as_str())).collect();
    assert_eq!(names, [("sql", "/adapters/sql"), ("support-fr", "/adapters/support-fr-lora")]);
    assert_eq!(r.max_adapters, 8);
    assert_eq!(b.table.ready_adapters(), [("sql", "model-llama"), ("support-fr", "model-llama")]);
    // No annotation: no adapters, and nothing to say.
    let plain = annotated(None, None);
    assert!(plain.table.routes["team-a/llama"].adapters.is_empty());
    assert_eq!(plain.notes, Vec::<String>::new());
    assert_eq!(annotated(Some("{}"), None).notes, Vec::<String>::new(), "an empty list needs no maximum");
}

#[test]
fn a_malformed_adapter_annotation_gives_a_note_and_no_adapters() {
    let cases = [
        (Some("not json"), Some("4"), "not a JSON object"),
        (Some(r#"["a"]"#), Some("4"), "not a JSON object"),
        (Some(r#"{"a": 3}"#), Some("4"), "not a JSON object"),
        (Some(r#"{"a": ""}"#), Some("4"), "empty adapter name or path"),
        (Some(r#"{"": "/p"}"#), Some("4"), "empty adapter name or path"),
        (Some(r#"{"model-llama": "/p"}"#), Some("4"), "names the base model"),
        (Some(r#"{"a": "/p"}"#), None, "without `flotilla.dev/max-adapters`"),
        (Some(r#"{"a": "/p"}"#), Some("0"), "above 0"),
        (Some(r#"{"a": "/p"}"#), Some("eight"), "above 0"),
        (Some(r#"{"a": "/p"}"#), Some("-1"), "above 0"),
    ];
    for (adapters, max, says) in cases {
        let b = annotated(adapters, max);
        let r = &b.table.routes["team-a/llama"];
        assert!(r.adapters.is_empty(), "{adapters:?} {max:?}");
        assert_eq!(r.endpoints.len(), 1, "the route still serves its base model");
        assert_eq!(b.notes.len(), 1, "{adapters:?} {max:?}: {:?}", b.notes);
        assert!(b.notes[0].contains("team-a/llama") && b.notes[0].contains(says), "{says}: {:?}", b.notes);
        assert!(b.table.ready_adapters().is_empty());
    }
}

#[test]
fn adapters_of_a_route_without_ready_endpoints_are_not_listed() {
    let mut v = route_json("team-a", "llama", "2024-01-01T00:00:00Z", "team-a/llama", "llama");
    v["metadata"]["annotations"]["flotilla.dev/adapters"] = json!(r#"{"a": "/p"}"#);
    v["metadata"]["annotations"]["flotilla.dev/max-adapters"] = json!("2");
    let b = run(&[route(v)], &[service("team-a", "llama")], &[]);
    assert_eq!(b.table.routes["team-a/llama"].adapters.len(), 1);
    assert!(b.table.ready_adapters().is_empty());
}
