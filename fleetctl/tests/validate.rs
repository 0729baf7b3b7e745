//! `fleetctl validate` as a user runs it: the example fleet passes, and every broken fixture
//! under `tests/fixtures/invalid/` fails with exit code 1 and a message naming the file, the
//! field and the problem (each fixture's `.expect`: line 1 the field, line 2 the message).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::Path;
use std::process::{Command, Output};

mod fixture_cases;

use fixture_cases::repo;

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl")).args(args).current_dir(repo()).output().expect("run fleetctl")
}

#[test]
fn example_fleet_is_valid_without_warnings() {
    let out = fleetctl(&["validate", "-f", "examples/fleet", "--strict"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("0 error(s), 0 warning(s)"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn every_invalid_fixture_fails_naming_file_field_and_problem() {
    let mut failures = Vec::new();
    for fixture_cases::Case { rel, field, message } in fixture_cases::cases("invalid", 12) {
        let (field, message) = (field.as_str(), message.as_str());
        let out = fleetctl(&["validate", "-f", &rel]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Exactly one error: the intended one, with no follow-on errors.
        let errors = stderr.lines().filter(|l| l.contains(": error: ")).count();
        let ok = out.status.code() == Some(1)
            && errors == 1
            && stderr.contains(&rel)
            && stderr.contains(field)
            && stderr.contains(message);
        if !ok {
            failures.push(format!(
                "{rel}: exit {:?}, {errors} error(s); wanted one naming {field:?} and {message:?} in:\n{stderr}",
                out.status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn json_report_lists_problems_with_locations() {
    let out = fleetctl(&["validate", "-f", "tests/fixtures/invalid/05-negative-replicas.yaml", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"], 1);
    let p = &report["problems"][0];
    assert_eq!(p["field"], "spec.replicas");
    assert!(Path::new(p["file"].as_str().unwrap()).ends_with("05-negative-replicas.yaml"));
    // The line and column of the field itself, not of its document's first line.
    let text = std::fs::read_to_string(repo().join("tests/fixtures/invalid/05-negative-replicas.yaml")).unwrap();
    let want = text.lines().position(|l| l.trim_start().starts_with("replicas: -1")).unwrap() + 1;
    assert_eq!(p["line"].as_u64(), Some(want as u64), "{p}");
    assert_eq!(p["column"].as_u64(), Some(3), "{p}");
    // The table says the same as `file:line:column`.
    let out = fleetctl(&["validate", "-f", "tests/fixtures/invalid/05-negative-replicas.yaml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("05-negative-replicas.yaml:{want}:3 (document 3): error:")), "{stderr}");
}

#[test]
fn missing_path_is_a_clear_error() {
    let out = fleetctl(&["validate", "-f", "does/not/exist"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does/not/exist"));
}

#[test]
fn crds_command_prints_six_crds_any_yaml_parser_reads() {
    let out = fleetctl(&["crds"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect();
    assert_eq!(docs.len(), 6);
    for d in &docs {
        assert_eq!(d["kind"], "CustomResourceDefinition");
        let v = &d["spec"]["versions"][0];
        assert!(v["subresources"]["status"].is_object(), "{}", d["metadata"]["name"]);
        assert!(v["additionalPrinterColumns"].as_array().is_some_and(|c| c.len() >= 3));
        assert!(d["spec"]["names"]["shortNames"].as_array().is_some_and(|s| !s.is_empty()));
    }
}

#[test]
fn a_model_name_shared_without_weights_on_every_deployment_is_a_warning_naming_the_field() {
    // A third deployment of the example's split name, without a weight: only it is warned.
    let dir = std::env::temp_dir().join(format!("fleetctl-shared-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("examples/fleet/deployments/llama-3.1-8b-canary.yaml")).unwrap();
    let shadow = text.replace("name: llama-3.1-8b-canary", "name: llama-3.1-8b-shadow").replace(
        "  routing:\n    weight: 10                                   # of 90 + 10: a tenth of the requests\n",
        "",
    );
    assert!(!shadow.contains("weight: 10"), "the copy gives no weight");
    let file = dir.join("shadow.yaml");
    std::fs::write(&file, shadow).unwrap();
    let out = fleetctl(&["validate", "-f", "examples/fleet", "-f", file.to_str().unwrap()]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "a warning, not an error: {text}");
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains(": warning: ")).collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("llama-3.1-8b-shadow")
            && warnings[0].contains("spec.routing.weight")
            && warnings[0].contains("llama-3.1-8b-instruct"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cluster_selector_that_matches_no_cluster_is_a_warning_saying_why() {
    let dir = std::env::temp_dir().join(format!("fleetctl-selector-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("examples/fleet/deployments/llama-3.3-70b-eu.yaml")).unwrap();
    assert!(text.contains("matchLabels: {flotilla.dev/env: prod}"));
    let file = dir.join("typo.yaml");
    std::fs::write(&file, text.replace("flotilla.dev/env: prod", "flotilla.dev/env: prd")).unwrap();
    let fleet: Vec<String> = [
        "classes.yaml",
        "clusters-eu.yaml",
        "clusters-us.yaml",
        "clusters-apac.yaml",
        "caches.yaml",
        "deployments/llama-3.1-405b-fp8.yaml",
    ]
    .iter()
    .map(|f| repo().join("examples/fleet").join(f).display().to_string())
    .collect();
    let mut args = vec!["validate".to_string()];
    for f in fleet.iter().chain([file.display().to_string()].iter()) {
        args.extend(["-f".to_string(), f.clone()]);
    }
    let out = fleetctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "a warning, not an error: {all}");
    let w: Vec<&str> = all.lines().filter(|l| l.contains("spec.placement.clusterSelector")).collect();
    assert_eq!(w.len(), 1, "{all}");
    assert!(w[0].contains("matches none of the") && w[0].contains("selector wants flotilla.dev/env=prd"), "{}", w[0]);
    // Twin: the example's own selector matches, and says nothing.
    let out = fleetctl(&["validate", "-f", "examples/fleet"]);
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains("matches none of the"), "{all}");
}

#[test]
fn a_device_selector_on_an_attribute_no_class_has_is_a_warning_naming_it() {
    let dir = std::env::temp_dir().join(format!("fleetctl-attr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("examples/fleet/deployments/llama-3.3-70b-eu.yaml")).unwrap();
    let memory = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#;
    assert!(text.contains(memory));
    let file = dir.join("attr.yaml");
    std::fs::write(&file, text.replace(memory, r#"device.attributes["gpu.nvidia.com"].hbmGeneration == "hbm3e""#))
        .unwrap();
    let out = fleetctl(&[
        "validate",
        "-f",
        "examples/fleet/classes.yaml",
        "-f",
        "examples/fleet/caches.yaml",
        "-f",
        file.to_str().unwrap(),
    ]);
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let w: Vec<&str> = all.lines().filter(|l| l.contains("no InferenceClass in this set satisfies")).collect();
    assert_eq!(w.len(), 1, "{all}");
    assert!(
        w[0].contains("spec.devices.alternatives[1]")
            && w[0].contains("selectors[0] reads what no InferenceClass publishes")
            && w[0].contains("hbmGeneration"),
        "{}",
        w[0]
    );
}
