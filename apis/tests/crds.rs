//! The generated CRDs: six of them, each with a status subresource, printer columns and
//! short names, and identical to the YAML committed under `charts/flotilla/crds/`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::PathBuf;

use flotilla_apis::crd;

fn committed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/flotilla/crds")
}

#[test]
fn six_crds_with_status_printer_columns_and_short_names() {
    let all = crd::all();
    assert_eq!(all.len(), 6);
    for c in &all {
        let name = c.metadata.name.clone().unwrap_or_default();
        assert_eq!(c.spec.group, "flotilla.dev", "{name}");
        let v = &c.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "{name} has no status subresource");
        assert!(v.additional_printer_columns.as_ref().is_some_and(|p| p.len() >= 3), "{name} lacks printer columns");
        assert!(c.spec.names.short_names.as_ref().is_some_and(|s| !s.is_empty()), "{name} lacks short names");
        assert!(c.spec.names.categories.as_ref().is_some_and(|c| c.iter().any(|c| c == "flotilla")));
    }
    let md = all.iter().find(|c| c.spec.names.kind == "ModelDeployment").unwrap();
    let scale = md.spec.versions[0].subresources.as_ref().and_then(|s| s.scale.as_ref()).expect("scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    let scopes: Vec<_> = all.iter().map(|c| (c.spec.names.kind.as_str(), c.spec.scope.as_str())).collect();
    assert_eq!(
        scopes,
        [
            ("InferenceClass", "Cluster"),
            ("InferenceCluster", "Cluster"),
            ("ModelDeployment", "Namespaced"),
            ("ModelCache", "Namespaced"),
            ("CapacityClaim", "Namespaced"),
            ("FleetQuota", "Namespaced"),
        ]
    );
}

#[test]
fn conditions_are_a_list_map_keyed_on_type() {
    for c in crd::all() {
        let schema = serde_json::to_value(&c.spec.versions[0].schema).unwrap();
        let conditions = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{:?}", c.metadata.name);
        assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
    }
}

/// The drift test: regenerate with `cargo run -p fleetctl -- crds --write charts/flotilla/crds`.
#[test]
fn committed_crds_match_the_types() {
    let dir = committed_dir();
    let mut expected_files = Vec::new();
    for c in crd::all() {
        let file = crd::file_name(&c);
        let want = crd::to_yaml(&c).unwrap();
        let path = dir.join(&file);
        let have = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            have == want,
            "{} differs from the Rust types; regenerate with `cargo run -p fleetctl -- crds --write charts/flotilla/crds`",
            path.display()
        );
        expected_files.push(file);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(present, expected_files, "stale CRD files in {}", dir.display());
}

#[test]
fn only_formats_the_api_server_knows() {
    // `kubectl apply` warns on formats it does not know (schemars writes `uint32` for u32).
    let known = ["int32", "int64", "float", "double", "byte", "date", "date-time", "duration", "uri", "uuid"];
    let yaml = crd::all_yaml().unwrap();
    for line in yaml.lines().filter_map(|l| l.trim().strip_prefix("format: ")) {
        assert!(known.contains(&line), "format {line} is not one the API server knows");
    }
    assert!(!yaml.contains("uint"), "no unsigned formats");
}
