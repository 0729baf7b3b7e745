//! `plan --rejections summary|full` on a generated fleet where many clusters refuse many
//! deployments: the summary (the default) counts every rejection of the full list under its
//! reason, drops no reason, shows only clusters the full list has, and changes nothing else
//! of the plan; `full` lists every rejection; `explain` keeps showing all of them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flotilla_placement::generate::{GenSpec, generate_objects};
use serde_json::Value;

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl")).args(args).output().expect("run fleetctl")
}

/// A generated fleet as one YAML stream (JSON documents), in a fresh directory.
fn generated_fleet(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetctl-rejections-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::new();
    for object in generate_objects(&GenSpec { clusters: 40, deployments: 200, seed: 1 }) {
        text.push_str("---\n");
        text.push_str(&object.to_json().unwrap().to_string());
        text.push('\n');
    }
    let file = dir.join("fleet.yaml");
    std::fs::write(&file, text).unwrap();
    file
}

fn json_plan(file: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["plan", "-f", file.to_str().unwrap(), "-o", "json"];
    args.extend_from_slice(extra);
    let out = fleetctl(&args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the fleet leaves replicas unplaced: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn table_plan(file: &Path, extra: &[&str]) -> String {
    let mut args = vec!["plan", "-f", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = fleetctl(&args);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn summary_counts_every_rejection_of_the_full_list_and_drops_no_reason() {
    let file = generated_fleet("json");
    let full = json_plan(&file, &["--rejections", "full"]);
    let summary = json_plan(&file, &[]);
    assert_eq!(summary, json_plan(&file, &["--rejections", "summary"]), "summary is the default");

    let (full_d, summary_d) = (full["deployments"].as_array().unwrap(), summary["deployments"].as_array().unwrap());
    assert_eq!(full_d.len(), summary_d.len());
    let (mut total, mut omitted) = (0usize, 0usize);
    for (f, s) in full_d.iter().zip(summary_d) {
        // Absence: each mode carries only its own form.
        assert!(f.get("rejectionSummary").is_none(), "{f}");
        assert!(s.get("rejections").is_none(), "{s}");
        let all = f["rejections"].as_array().cloned().unwrap_or_default();
        let groups = s["rejectionSummary"].as_array().cloned().unwrap_or_default();
        let mut per_reason: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &all {
            *per_reason.entry(r["reason"].as_str().unwrap()).or_default() += 1;
        }
        let summarised: BTreeMap<&str, usize> =
            groups.iter().map(|g| (g["reason"].as_str().unwrap(), g["clusters"].as_u64().unwrap() as usize)).collect();
        assert_eq!(summarised, per_reason, "{}: one group per reason, counts as in the full list", s["name"]);
        for g in &groups {
            let examples = g["examples"].as_array().unwrap();
            assert!(!examples.is_empty() && examples.len() <= 3, "{g}");
            assert_eq!(examples.len() + g["more"].as_u64().unwrap() as usize, g["clusters"].as_u64().unwrap() as usize);
            for e in examples {
                assert!(
                    all.iter().any(|r| r["cluster"] == e["cluster"]
                        && r["reason"] == g["reason"]
                        && r["message"] == e["message"]),
                    "example {e} of {} is not in the full list",
                    g["reason"]
                );
            }
            omitted += g["more"].as_u64().unwrap() as usize;
        }
        total += all.len();
    }
    assert!(
        total > 1000 && omitted > total / 2,
        "a fleet where the summary leaves most out: {total} rejections, {omitted} omitted"
    );

    // Apart from the rejections, the two documents are the same.
    let strip = |mut v: Value, key: &str| {
        for d in v["deployments"].as_array_mut().unwrap() {
            d.as_object_mut().unwrap().remove(key);
        }
        v
    };
    assert_eq!(strip(full, "rejections"), strip(summary, "rejectionSummary"));
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

#[test]
fn the_summary_table_shows_only_lines_of_the_full_table_and_says_how_many_more() {
    let file = generated_fleet("table");
    let full = table_plan(&file, &["--rejections", "full"]);
    let summary = table_plan(&file, &[]);
    // The UNPLACED section, up to the CLAIMS preview.
    let section = |t: &str| {
        let (table, rest) = t.split_once("\nUNPLACED\n").unwrap();
        (table.to_string(), rest.split_once("\nCLAIMS").map_or(rest, |(u, _)| u).to_string())
    };
    let (full_unplaced, summary_unplaced) = (section(&full), section(&summary));
    assert_eq!(full_unplaced.0, summary_unplaced.0, "the placement table is the same");
    let full_lines: std::collections::BTreeSet<&str> = full_unplaced.1.lines().collect();
    let mut more = 0usize;
    for line in summary_unplaced.1.lines() {
        if let Some(rest) = line.strip_prefix("  ... and ") {
            more += rest.split_once(' ').unwrap().0.parse::<usize>().unwrap();
        } else if line.starts_with("  ") {
            // Column widths can differ between the two tables; compare the words.
            let words: Vec<&str> = line.split_whitespace().collect();
            assert!(
                full_lines.iter().any(|l| l.split_whitespace().eq(words.iter().copied())),
                "summary line not in the full list: {line}"
            );
        }
    }
    let full_rows = full_unplaced.1.lines().filter(|l| l.starts_with("  ") && !l.starts_with("  alternative ")).count();
    let summary_rows = summary_unplaced
        .1
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("  alternative ") && !l.starts_with("  ... and "))
        .count();
    assert_eq!(summary_rows + more, full_rows, "shown + more = every rejection");
    assert!(summary.contains("--rejections full lists every cluster"), "the summary says how to see everything");
    assert!(!full.contains("... and "), "the full list leaves nothing out");
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

#[test]
fn explain_shows_every_rejection_of_its_deployment() {
    let file = generated_fleet("explain");
    let summary = json_plan(&file, &[]);
    let short = summary["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rejectionSummary"].as_array().is_some_and(|g| g.iter().any(|g| g["more"].as_u64() > Some(0))))
        .expect("a deployment whose summary leaves clusters out");
    let target =
        format!("modeldeployment/{}/{}", short["namespace"].as_str().unwrap(), short["name"].as_str().unwrap());
    let out = fleetctl(&["explain", "-f", file.to_str().unwrap(), &target, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let explained: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rejections = explained["rejections"].as_array().unwrap().len();
    let out = fleetctl(&["explain", "-f", file.to_str().unwrap(), &target]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("... and "), "{text}");
    let section = text.split_once(" replicas unplaced\n").map_or("", |(_, s)| s);
    let rows = section.lines().filter(|l| l.starts_with("  ") && !l.starts_with("  alternative ")).count();
    assert_eq!(rows, rejections, "every rejection of the explained deployment is listed:\n{text}");
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}
