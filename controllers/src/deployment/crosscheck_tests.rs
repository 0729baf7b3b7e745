use flotilla_apis::document::{FleetObject, parse_stream};
use flotilla_placement::SolveOptions;

use super::*;

/// The example fleet (`examples/fleet`), as the stores would hold it.
fn example() -> FleetObjects {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fleet");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.extend(std::fs::read_dir(format!("{dir}/deployments")).unwrap().map(|e| e.unwrap().path()));
    let mut out = FleetObjects::default();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let parsed = parse_stream(&f.display().to_string(), &std::fs::read_to_string(f).unwrap());
        for o in parsed.objects {
            match o.value {
                FleetObject::Class(c) => out.classes.push(Arc::new(c)),
                FleetObject::Cluster(c) => out.clusters.push(Arc::new(c)),
                FleetObject::Cache(c) => out.caches.push(Arc::new(c)),
                FleetObject::Deployment(d) => out.deployments.push(Arc::new(d)),
                FleetObject::Quota(q) => out.quotas.push(Arc::new(q)),
                FleetObject::Claim(_) => {}
            }
        }
    }
    assert!(out.deployments.len() >= 3 && !out.clusters.is_empty(), "the example fleet was read");
    out
}

fn whole(s: &FleetSnapshot) -> Replanner {
    Replanner::new(s, SolveOptions::default())
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flotilla-crosscheck-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A re-plan of the example fleet after one deployment asked for one more replica.
fn replanned() -> (Sample, Replanner) {
    let before = example();
    let mut after = before.clone();
    let mut d = after.deployments[0].as_ref().clone();
    d.spec.replicas += 1;
    after.deployments[0] = Arc::new(d);
    let mut r = whole(&before.snapshot());
    let snapshot = after.snapshot();
    r.replan(&snapshot);
    let sample = Sample { before: Some(before), after, snapshot, plan: r.plan().clone() };
    (sample, r)
}

#[test]
fn the_deployments_whose_entries_differ_or_are_missing_are_named() {
    let (sample, _) = replanned();
    let plan = sample.plan;
    assert!(differing(&plan, &plan).is_empty());
    let mut moved = plan.clone();
    moved.deployments[1].unplaced += 7;
    let mut missing = plan.clone();
    let gone = missing.deployments.remove(2);
    let name = |d: &DeploymentPlan| format!("{}/{}", d.namespace, d.name);
    assert_eq!(differing(&moved, &plan), [name(&plan.deployments[1])]);
    assert_eq!(differing(&plan, &missing), [name(&gone)]);
}

#[test]
fn a_re_plan_equal_to_the_whole_solve_is_counted_and_nothing_is_written() {
    let metrics = Metrics::default();
    let out = dir("same");
    let check = CrossCheck::new(16, out.clone(), metrics.clone());
    let (sample, _) = replanned();
    assert!(matches!(check.check(&sample, whole), Found::Same));
    assert_eq!(metrics.replan_checks(ReplanCheck::Same), 1);
    assert_eq!(metrics.replan_checks(ReplanCheck::Diverged), 0);
    assert!(!out.exists(), "no reproducer without a divergence");
}

#[test]
fn a_divergence_is_counted_written_as_a_reproducer_and_the_whole_solve_returned() {
    let metrics = Metrics::default();
    let out = dir("diverged");
    let check = CrossCheck::new(16, out.clone(), metrics.clone());
    let (mut sample, _) = replanned();
    // A re-plan that lost one deployment's replicas (the kind of bug the check is for).
    let lost = format!("{}/{}", sample.plan.deployments[0].namespace, sample.plan.deployments[0].name);
    sample.plan.deployments[0].unplaced += 7;
    let Found::Diverged(differ, repro, returned) = check.check(&sample, whole) else { panic!("not found") };
    assert_eq!(differ, [lost]);
    assert_eq!(metrics.replan_checks(ReplanCheck::Diverged), 1);
    // The whole plan comes back to be taken.
    assert_eq!(returned.plan(), whole(&sample.snapshot).plan());
    // The reproducer: both fleets (parseable, the changed replica count in the later one) and
    // both plans.
    let repro = repro.expect("written");
    assert!(repro.starts_with(&out));
    let after = std::fs::read_to_string(repro.join("after.yaml")).unwrap();
    let parsed = parse_stream("after.yaml", &after);
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    assert_eq!(
        parsed.objects.len(),
        sample.after.deployments.len()
            + sample.after.clusters.len()
            + sample.after.classes.len()
            + sample.after.caches.len()
            + sample.after.quotas.len()
    );
    assert!(after.contains("kind: FleetQuota"), "the quotas the plan held to are in the reproducer");
    assert!(std::fs::read_to_string(repro.join("before.yaml")).unwrap().contains("kind: ModelDeployment"));
    for plan in ["replanned.json", "whole.json"] {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repro.join(plan)).unwrap()).unwrap();
        assert!(v["deployments"].as_array().is_some_and(|d| !d.is_empty()), "{plan}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_whole_solve_that_fails_keeps_the_re_plan_and_says_so() {
    let metrics = Metrics::default();
    let check = CrossCheck::new(16, dir("failed"), metrics.clone());
    let (sample, _) = replanned();
    assert!(matches!(check.check(&sample, |_| panic!("injected")), Found::Failed));
    assert_eq!(metrics.replan_checks(ReplanCheck::Failed), 1);
}

#[test]
fn one_re_plan_in_k_is_checked_and_none_when_k_is_zero() {
    let check = CrossCheck::new(4, dir("due"), Metrics::default());
    let due: Vec<bool> = (0..8)
        .map(|_| {
            let due = check.due();
            if due {
                check.finished();
            }
            due
        })
        .collect();
    assert_eq!(due, [false, false, false, true, false, false, false, true]);
    // While a check runs, no other starts: the next one in K after it finished does.
    let one = CrossCheck::new(1, dir("one"), Metrics::default());
    assert!(one.due());
    assert!(!one.due() && !one.due(), "a second check while the first runs");
    one.finished();
    assert!(one.due());
    let never = CrossCheck::new(0, dir("never"), Metrics::default());
    assert!((0..100).all(|_| !never.due()));
}

#[tokio::test]
async fn a_resolved_divergence_moves_the_plans_key_on_and_ticks_the_trigger() {
    let check = Arc::new(CrossCheck::new(1, dir("spawn"), Metrics::default()));
    let mut ticks = std::pin::pin!(check.resolutions());
    let (mut sample, r) = replanned();
    sample.plan.deployments[0].unplaced += 7;
    let (tx, rx) = std::sync::mpsc::channel();
    check.spawn(sample, whole, move |r| tx.send(r.plan().clone()).unwrap());
    let taken = tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("the whole solve was handed over");
    assert_eq!(&taken, r.plan(), "the whole plan, not the diverged one");
    tokio::time::timeout(std::time::Duration::from_secs(60), futures_util::StreamExt::next(&mut ticks))
        .await
        .expect("the trigger was ticked");
    assert_eq!(check.epoch(), 1);
}
