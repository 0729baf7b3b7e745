//! How an InferenceCluster says the controller reaches its member, checked as `fleetctl
//! validate` checks it (`parse_stream`: schema and CEL rules; `validate_set`: the rest): a
//! kubeconfig Secret or a ClusterProfile, not both (an error naming `spec.clusterProfileRef`),
//! and neither is a warning naming `spec.credentials`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::document::{Severity, parse_stream};
use flotilla_apis::validate::validate_set;

const CLASS: &str = "apiVersion: flotilla.dev/v1alpha1
kind: InferenceClass
metadata: {name: h100}
spec:
  device: {driver: gpu.nvidia.com, attributes: {productName: {string: H100}}}
  devicesPerNode: 8
  pricePerNodeHour: {onDemand: \"98.32\"}
";

fn problems(way_in: &str) -> Vec<(Severity, String, String)> {
    let text = format!(
        "{CLASS}---
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {{name: eu-fra-1}}
spec:
  provider: {{static: {{site: fra}}}}
  region: fra
  jurisdiction: EU
  endpoint: https://inference.fra.example.com
  pools: [{{name: h100, class: h100, maxNodes: 2, capacityTypes: [on-demand]}}]
{way_in}"
    );
    let parsed = parse_stream("fleet.yaml", &text);
    let mut out: Vec<_> = parsed.problems.iter().map(|p| (p.severity, p.field.clone(), p.message.clone())).collect();
    out.extend(validate_set(&parsed.objects, &parsed.refused).into_iter().map(|p| (p.severity, p.field, p.message)));
    out
}

#[test]
fn a_secret_or_a_profile_not_both_and_not_neither() {
    let secret = "  credentials: {secretRef: {namespace: flotilla-system, name: eu-fra-1-kubeconfig}}\n";
    let profile = "  clusterProfileRef: {namespace: fleet-system, name: eu-fra-1}\n";
    assert_eq!(problems(secret), vec![]);
    assert_eq!(problems(profile), vec![]);
    let both = problems(&format!("{secret}{profile}"));
    assert_eq!(both.len(), 1, "{both:?}");
    assert_eq!(both[0].0, Severity::Error);
    assert!(both[0].1.contains("spec.clusterProfileRef"), "{both:?}");
    assert!(both[0].2.contains("set at most one of spec.credentials and spec.clusterProfileRef"), "{both:?}");
    let neither = problems("");
    assert_eq!(neither.len(), 1, "{neither:?}");
    assert_eq!(neither[0].0, Severity::Warning);
    assert_eq!(neither[0].1, "spec.credentials");
    assert!(neither[0].2.contains("neither credentials nor clusterProfileRef"), "{neither:?}");
}
