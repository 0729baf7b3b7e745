//! How much of a plan's rejections `plan` prints. In full, every cluster that refused a
//! deployment with unplaced replicas, with its reason and message (at 1,000 × 5,000 that is
//! over half a million lines). Summarised (the default), per deployment: how many clusters
//! refused it for each reason, most frequent first, with the first few clusters of each reason
//! in plan order as examples and how many more there are. Pure: rejections in, summary out.

use flotilla_placement::plan::{DeploymentPlan, Reason, Rejection};
use serde::Serialize;

/// Clusters shown per reason in a summary.
pub const EXAMPLES_PER_REASON: usize = 3;

/// How `plan` prints rejections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Detail {
    /// Per deployment: clusters per reason, with a few examples of each.
    #[default]
    Summary,
    /// Every cluster with its reason and message.
    Full,
}

/// The clusters that refused one deployment for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasonSummary {
    /// The reason code.
    pub reason: Reason,
    /// How many clusters refused for it.
    pub clusters: usize,
    /// The first of them in plan order, at most [`EXAMPLES_PER_REASON`].
    pub examples: Vec<Example>,
    /// How many are not among the examples (`clusters - examples.len()`).
    pub more: usize,
}

/// One example cluster of a reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Example {
    /// The InferenceCluster.
    pub cluster: String,
    /// The numbers behind the reason.
    pub message: String,
}

/// Groups rejections by reason: most clusters first (ties in the reason's order), each with
/// its first `examples` clusters in the order given. Every reason present is kept, and the
/// counts add up to `rejections.len()`.
pub fn summarise(rejections: &[Rejection], examples: usize) -> Vec<ReasonSummary> {
    let mut groups: Vec<ReasonSummary> = Vec::new();
    for r in rejections {
        let at = match groups.iter().position(|g| g.reason == r.reason) {
            Some(at) => at,
            None => {
                groups.push(ReasonSummary { reason: r.reason, clusters: 0, examples: Vec::new(), more: 0 });
                groups.len() - 1
            }
        };
        let g = &mut groups[at];
        g.clusters += 1;
        if g.examples.len() < examples {
            g.examples.push(Example { cluster: r.cluster.clone(), message: r.message.clone() });
        } else {
            g.more += 1;
        }
    }
    groups.sort_by(|a, b| b.clusters.cmp(&a.clusters).then(a.reason.cmp(&b.reason)));
    groups
}

/// One deployment of `plan -o json|yaml` with its rejections summarised: the plan's fields,
/// `rejections` left out, `rejectionSummary` instead.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SummarisedDeployment<'a> {
    /// The plan, rejections emptied (so not serialised).
    #[serde(flatten)]
    pub plan: &'a DeploymentPlan,
    /// Clusters per reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejection_summary: Vec<ReasonSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(cluster: &str, reason: Reason) -> Rejection {
        Rejection { cluster: cluster.into(), reason, message: format!("{cluster} says {reason}") }
    }

    fn mixed() -> Vec<Rejection> {
        let mut out = Vec::new();
        for i in 0..10 {
            out.push(rejection(&format!("us-{i}"), Reason::JurisdictionNotAllowed));
            if i % 3 == 0 {
                out.push(rejection(&format!("eu-{i}"), Reason::InsufficientDevices));
            }
        }
        out.push(rejection("ap-1", Reason::ClusterNotReady));
        out
    }

    #[test]
    fn counts_add_up_and_no_reason_is_dropped() {
        let all = mixed();
        let summary = summarise(&all, EXAMPLES_PER_REASON);
        assert_eq!(summary.iter().map(|g| g.clusters).sum::<usize>(), all.len());
        for g in &summary {
            assert_eq!(g.examples.len() + g.more, g.clusters, "{g:?}");
            assert!(g.examples.len() <= EXAMPLES_PER_REASON);
            assert_eq!(g.clusters, all.iter().filter(|r| r.reason == g.reason).count());
        }
        // The reason with one cluster is kept, even though it is the rarest.
        let reasons: Vec<Reason> = summary.iter().map(|g| g.reason).collect();
        assert_eq!(
            reasons,
            [Reason::JurisdictionNotAllowed, Reason::InsufficientDevices, Reason::ClusterNotReady],
            "most clusters first"
        );
        // Examples are the first clusters of each reason, in the order given.
        let us: Vec<&str> = summary[0].examples.iter().map(|e| e.cluster.as_str()).collect();
        assert_eq!(us, ["us-0", "us-1", "us-2"]);
        assert_eq!(summary[0].more, 7);
        // Absence: no example appears under a reason it was not rejected for.
        for g in &summary {
            for e in &g.examples {
                assert!(all.iter().any(|r| r.cluster == e.cluster && r.reason == g.reason && r.message == e.message));
            }
        }
    }

    #[test]
    fn enough_examples_keep_every_rejection() {
        let all = mixed();
        let summary = summarise(&all, usize::MAX);
        assert!(summary.iter().all(|g| g.more == 0));
        let mut back: Vec<(String, Reason, String)> = summary
            .iter()
            .flat_map(|g| g.examples.iter().map(|e| (e.cluster.clone(), g.reason, e.message.clone())))
            .collect();
        let mut want: Vec<(String, Reason, String)> =
            all.iter().map(|r| (r.cluster.clone(), r.reason, r.message.clone())).collect();
        back.sort();
        want.sort();
        assert_eq!(back, want);
    }

    #[test]
    fn ties_are_ordered_by_reason_and_nothing_gives_nothing() {
        let all = vec![rejection("b", Reason::RegionDenied), rejection("a", Reason::ClusterSelectorMismatch)];
        let summary = summarise(&all, 1);
        assert_eq!(summary[0].reason, Reason::ClusterSelectorMismatch);
        assert_eq!(summary[1].reason, Reason::RegionDenied);
        assert!(summarise(&[], 3).is_empty());
    }
}
