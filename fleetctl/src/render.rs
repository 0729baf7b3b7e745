//! Rendering plans for people: the placement table, the unplaced section (every cluster's
//! reason, or per reason a count and a few example clusters), and `explain`'s per-cluster
//! filter verdicts and candidate scores.

use std::fmt::Write as _;

use flotilla_apis::common::format_price_micros;
use flotilla_placement::plan::{DeploymentPlan, Plan};

use crate::rejections::{self, Detail};

/// Aligned columns separated by two spaces; the last cell of a row is not padded.
pub fn table(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The plan as a table plus an unplaced section, its rejections in `detail`.
pub fn plan_table(plan: &Plan, detail: Detail) -> String {
    let mut rows = vec![
        ["DEPLOYMENT", "MODEL", "CLUSTER", "POOL", "REPLICAS", "CLASS", "CAPACITY", "FALLBACK", "$/H"]
            .map(String::from)
            .to_vec(),
    ];
    for d in &plan.deployments {
        let id = format!("{}/{}", d.namespace, d.name);
        if d.assignments.is_empty() {
            rows.push(vec![
                id.clone(),
                d.model.clone(),
                "-".into(),
                "-".into(),
                "0".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "0.00".into(),
            ]);
        }
        for a in &d.assignments {
            rows.push(vec![
                id.clone(),
                d.model.clone(),
                a.cluster.clone(),
                a.pool.clone(),
                a.replicas.to_string(),
                a.class.clone(),
                a.capacity_type.to_string(),
                a.fallback_rank.to_string(),
                format_price_micros(a.cost_micros_per_hour),
            ]);
        }
    }
    let mut out = table(&rows);
    let placed: u32 = plan.deployments.iter().flat_map(|d| &d.assignments).map(|a| a.replicas).sum();
    let desired: u32 = plan.deployments.iter().map(|d| d.desired).sum();
    let cost: u64 = plan.deployments.iter().map(|d| d.cost_micros_per_hour).sum();
    let _ = writeln!(out, "\n{placed} of {desired} replicas placed, ${}/h", format_price_micros(cost));
    if let Some(report) = &plan.exact {
        out.push_str(&exact_line(report));
    }
    out.push_str(&quota_table(plan));
    let short: Vec<&DeploymentPlan> =
        plan.deployments.iter().filter(|d| d.unplaced > 0 || !d.unmet_minimums.is_empty()).collect();
    if !short.is_empty() {
        out.push_str("\nUNPLACED\n");
        let mut omitted = false;
        for d in short {
            match detail {
                Detail::Full => out.push_str(&unplaced_section(d)),
                Detail::Summary => {
                    let (text, more) = unplaced_summary(d);
                    out.push_str(&text);
                    omitted |= more;
                }
            }
        }
        if omitted {
            let _ = writeln!(
                out,
                "(at most {} clusters shown per reason; --rejections full lists every cluster)",
                rejections::EXAMPLES_PER_REASON
            );
        }
    }
    out
}

/// Every FleetQuota's usage in the plan (`QUOTAS`), or nothing when there are none.
pub fn quota_table(plan: &Plan) -> String {
    if plan.quotas.is_empty() {
        return String::new();
    }
    let mut rows = vec![["QUOTA", "USAGE", "UNPLACED"].map(String::from).to_vec()];
    for q in &plan.quotas {
        let state = if q.unplaced > 0 { format!("{} (QuotaExceeded)", q.unplaced) } else { "0".into() };
        rows.push(vec![format!("{}/{}", q.namespace, q.name), q.summary(), state]);
    }
    format!("\nQUOTAS\n{}", table(&rows))
}

fn unplaced_header(out: &mut String, d: &DeploymentPlan) {
    let _ = write!(out, "{}/{}: {} of {} replicas unplaced", d.namespace, d.name, d.unplaced, d.desired);
}

fn unmet_minimums(out: &mut String, d: &DeploymentPlan) {
    for m in &d.unmet_minimums {
        let _ = writeln!(out, "  alternative {} wants at least {} replicas, got {}", m.rank, m.wanted, m.placed);
    }
}

/// A deployment's unplaced replicas with, per reason, how many clusters gave it and the first
/// few of them (each line as in the full list); whether some clusters were left out.
fn unplaced_summary(d: &DeploymentPlan) -> (String, bool) {
    let groups = rejections::summarise(&d.rejections, rejections::EXAMPLES_PER_REASON);
    let mut out = String::new();
    unplaced_header(&mut out, d);
    if !groups.is_empty() {
        let counts: Vec<String> = groups.iter().map(|g| format!("{} {}", g.clusters, g.reason)).collect();
        let _ = write!(out, "; refused by {} cluster(s): {}", d.rejections.len(), counts.join(", "));
    }
    out.push('\n');
    unmet_minimums(&mut out, d);
    let rows: Vec<Vec<String>> = groups
        .iter()
        .flat_map(|g| {
            g.examples.iter().map(|e| vec![format!("  {}", e.cluster), g.reason.to_string(), e.message.clone()])
        })
        .collect();
    let text = table(&rows);
    let mut lines = text.lines();
    let mut omitted = false;
    for g in &groups {
        for line in lines.by_ref().take(g.examples.len()) {
            out.push_str(line);
            out.push('\n');
        }
        if g.more > 0 {
            let _ = writeln!(out, "  ... and {} more {}", g.more, g.reason);
            omitted = true;
        }
    }
    (out, omitted)
}

fn unplaced_section(d: &DeploymentPlan) -> String {
    let mut out = String::new();
    unplaced_header(&mut out, d);
    out.push('\n');
    unmet_minimums(&mut out, d);
    let rows: Vec<Vec<String>> = d
        .rejections
        .iter()
        .map(|r| vec![format!("  {}", r.cluster), r.reason.to_string(), r.message.clone()])
        .collect();
    out.push_str(&table(&rows));
    out
}

/// `explain`: every cluster's verdicts and candidates for one deployment.
pub fn explain_text(d: &DeploymentPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}/{} (model {}): {} of {} replicas placed, ${}/h",
        d.namespace,
        d.name,
        d.model,
        d.desired - d.unplaced,
        d.desired,
        format_price_micros(d.cost_micros_per_hour)
    );
    for c in d.explanation.iter().flatten() {
        let _ = writeln!(out, "\n{} — {} replica(s) placed", c.cluster, c.placed);
        let mut rows = Vec::new();
        for v in &c.verdicts {
            // A cluster with a usable pool was not rejected: a verdict against one pool or
            // alternative there only says that pool was not a candidate for it (`skip`).
            let verdict = match v.reason {
                None => "pass".to_string(),
                Some(r) if c.candidates.is_empty() => format!("FAIL {r}"),
                Some(r) => format!("skip {r}"),
            };
            rows.push(vec![format!("  {}", v.filter), verdict, v.detail.clone()]);
        }
        out.push_str(&table(&rows));
        if !c.candidates.is_empty() {
            let mut rows = vec![
                ["  POOL", "CLASS", "ALT", "CAPACITY", "PREF", "$/H/REPLICA", "STICKY", "FREE SLOTS"]
                    .map(String::from)
                    .to_vec(),
            ];
            for s in &c.candidates {
                rows.push(vec![
                    format!("  {}", s.pool),
                    s.class.clone(),
                    s.fallback_rank.to_string(),
                    s.capacity_type.to_string(),
                    (s.capacity_type_rank + 1).to_string(),
                    format_price_micros(s.replica_price_micros),
                    if s.sticky { "yes" } else { "no" }.to_string(),
                    s.free_replica_slots.to_string(),
                ]);
            }
            out.push_str(&table(&rows));
        }
    }
    if !d.moves.is_empty() {
        out.push_str("\nMOVED AFTER THE GREEDY PASS\n");
        let me = format!("{}/{}", d.namespace, d.name);
        for m in &d.moves {
            let n = m.replicas;
            let _ = if m.closes_spread_domain && m.moved == me {
                writeln!(
                    out,
                    "  {n} replica(s) moved from {} to {} so that its spread domain can take no further replica of {}, \
                     which may then grow elsewhere",
                    m.from, m.to, m.made_room_for
                )
            } else if m.closes_spread_domain {
                writeln!(
                    out,
                    "  {n} replica(s) of {} moved from {} to {}: that spread domain can take no further replica of \
                     this one, so it may grow in others",
                    m.moved, m.from, m.to
                )
            } else if m.lowers_cost {
                writeln!(
                    out,
                    "  {n} replica(s) moved from {} to {}: a pool ranked before it, cheaper, had room after the \
                     other moves",
                    m.from, m.to
                )
            } else if m.higher_priority && m.moved == me {
                writeln!(
                    out,
                    "  {n} replica(s) moved from {} to {} to make room for {} (lower priority): the same device \
                     alternative and capacity type, another price",
                    m.from, m.to, m.made_room_for
                )
            } else if m.moved == me {
                writeln!(out, "  {n} replica(s) moved from {} to {} to make room for {}", m.from, m.to, m.made_room_for)
            } else if m.higher_priority {
                writeln!(
                    out,
                    "  placed on {} after {n} replica(s) of {} (higher priority) moved to {}, an equally ranked pool \
                     but for price",
                    m.from, m.moved, m.to
                )
            } else {
                writeln!(out, "  placed on {} after {n} replica(s) of {} moved to {}", m.from, m.moved, m.to)
            };
        }
    }
    if !d.preemptions.is_empty() {
        out.push_str("\nPREEMPTED AFTER THE GREEDY PASS\n");
        let me = format!("{}/{}", d.namespace, d.name);
        for p in &d.preemptions {
            let n = p.replicas;
            let _ = if p.preempted == me {
                writeln!(out, "  {n} replica(s) on {} preempted by {} (higher priority)", p.from, p.by)
            } else {
                writeln!(
                    out,
                    "  placed after preempting {n} replica(s) of {} on {} (lower priority)",
                    p.preempted, p.from
                )
            };
        }
    }
    if let Some(t) = &d.trade {
        out.push_str("\nSAME-TIER TRADE\n");
        let tier = format!(
            "priority {} solved in another order than creation order: {} replica(s) of the tier placed instead of {}",
            t.priority, t.tier_placed_after, t.tier_placed_before
        );
        let _ = match t.position {
            Some(p) => writeln!(out, "  its tier, {tier}; this deployment solved {}", ordinal(p + 1)),
            None => writeln!(out, "  a higher tier, {tier}"),
        };
        if t.gave_up > 0 {
            let _ = writeln!(out, "  {} replica(s) fewer than in creation order: the trade's price", t.gave_up);
        }
    }
    if d.unplaced > 0 {
        out.push('\n');
        out.push_str(&unplaced_section(d));
    }
    out
}

/// `1st`, `2nd`, `3rd`, `4th`, … `11th`, `12th`, `13th`, `21st`.
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// What the exact mode did: which pass produced the plan, per tier the greedy's, the
/// optimum's and the plan's replicas, and why the optimum was not used when it was not.
pub fn exact_line(report: &flotilla_placement::ExactReport) -> String {
    use flotilla_placement::exact::Producer;
    let by = match report.produced_by {
        Producer::Exact => "the greedy guided by the exact optimum",
        Producer::Greedy => "the greedy pass",
    };
    let proven = match (report.proven, report.time_limit_reached) {
        (true, _) => "proven optimal",
        (false, false) => "not proven optimal within the node budget",
        (false, true) => "not proven optimal: the time limit was reached, another run may differ",
    };
    let tiers: Vec<String> = report
        .tiers
        .iter()
        .map(|t| {
            let optimum = t.optimum.map_or_else(|| "-".to_string(), |n| n.to_string());
            format!("priority {}: greedy {}, optimum {optimum}, plan {}", t.priority, t.greedy, t.plan)
        })
        .collect();
    let mut out = format!("exact mode: plan by {by} ({proven}); {}\n", tiers.join("; "));
    if let Some(note) = &report.note {
        let _ = writeln!(out, "exact mode: {note}");
    }
    out
}

#[cfg(test)]
mod tests {
    use flotilla_placement::{DeploymentPlan, Move, Preemption};

    #[test]
    fn explain_says_which_replicas_a_move_placed_and_which_it_moved() {
        let m = Move {
            moved: "ml/flexible".into(),
            from: "a/h100".into(),
            to: "b/h200".into(),
            made_room_for: "ml/h100-only".into(),
            replicas: 2,
            closes_spread_domain: false,
            higher_priority: false,
            lowers_cost: false,
        };
        let plan = |name: &str| DeploymentPlan {
            namespace: "ml".into(),
            name: name.into(),
            desired: 2,
            moves: vec![m.clone()],
            ..Default::default()
        };
        let moved = super::explain_text(&plan("flexible"));
        assert!(moved.contains("MOVED AFTER THE GREEDY PASS"), "{moved}");
        assert!(moved.contains("2 replica(s) moved from a/h100 to b/h200 to make room for ml/h100-only"), "{moved}");
        let gained = super::explain_text(&plan("h100-only"));
        assert!(gained.contains("placed on a/h100 after 2 replica(s) of ml/flexible moved to b/h200"), "{gained}");
        // Absence: no moves, no section.
        let quiet = super::explain_text(&DeploymentPlan { moves: vec![], ..plan("other") });
        assert!(!quiet.contains("MOVED"), "{quiet}");
        assert!(!moved.contains("PREEMPTED"), "{moved}");
        assert!(!moved.contains("spread domain") && !gained.contains("spread domain"), "{moved}{gained}");
        // A move that closes a spread domain says so, and does not claim the room it left.
        let closing =
            |name: &str| DeploymentPlan { moves: vec![Move { closes_spread_domain: true, ..m.clone() }], ..plan(name) };
        let moved = super::explain_text(&closing("flexible"));
        assert!(
            moved.contains(
                "moved from a/h100 to b/h200 so that its spread domain can take no further replica of ml/h100-only"
            ),
            "{moved}"
        );
        let gained = super::explain_text(&closing("h100-only"));
        assert!(gained.contains("of ml/flexible moved from a/h100 to b/h200: that spread domain"), "{gained}");
        assert!(!gained.contains("placed on a/h100"), "{gained}");
        // A higher priority's move for a lower one names what it kept and what it gave up.
        let up = |name: &str| DeploymentPlan { moves: vec![Move { higher_priority: true, ..m.clone() }], ..plan(name) };
        let moved = super::explain_text(&up("flexible"));
        assert!(
            moved.contains(
                "moved from a/h100 to b/h200 to make room for ml/h100-only (lower priority): the same device \
                 alternative and capacity type, another price"
            ),
            "{moved}"
        );
        let gained = super::explain_text(&up("h100-only"));
        assert!(gained.contains("of ml/flexible (higher priority) moved to b/h200"), "{gained}");
        assert!(
            !super::explain_text(&plan("flexible")).contains("priority"),
            "a move between equals says nothing of it"
        );
        // A move that only lowered the deployment's own cost says so, and claims no room.
        let own =
            Move { moved: "ml/flexible".into(), made_room_for: "ml/flexible".into(), lowers_cost: true, ..m.clone() };
        let cheaper = super::explain_text(&DeploymentPlan { moves: vec![own], ..plan("flexible") });
        assert!(
            cheaper.contains("2 replica(s) moved from a/h100 to b/h200: a pool ranked before it, cheaper, had room"),
            "{cheaper}"
        );
        assert!(!cheaper.contains("make room"), "{cheaper}");
    }

    #[test]
    fn explain_says_who_preempted_whom() {
        let p =
            Preemption { preempted: "ml/low".into(), from: "b/h200".into(), by: "ml/h100-only".into(), replicas: 1 };
        let plan = |name: &str| DeploymentPlan {
            namespace: "ml".into(),
            name: name.into(),
            desired: 1,
            preemptions: vec![p.clone()],
            ..Default::default()
        };
        let lost = super::explain_text(&plan("low"));
        assert!(lost.contains("PREEMPTED AFTER THE GREEDY PASS"), "{lost}");
        assert!(lost.contains("1 replica(s) on b/h200 preempted by ml/h100-only (higher priority)"), "{lost}");
        let gained = super::explain_text(&plan("h100-only"));
        assert!(
            gained.contains("placed after preempting 1 replica(s) of ml/low on b/h200 (lower priority)"),
            "{gained}"
        );
        // Absence: no preemptions, no section.
        let quiet = super::explain_text(&DeploymentPlan { preemptions: vec![], ..plan("other") });
        assert!(!quiet.contains("PREEMPTED"), "{quiet}");
    }

    #[test]
    fn explain_says_a_tier_was_traded_and_what_it_cost() {
        use flotilla_placement::plan::TierTrade;
        let plan = |trade: Option<TierTrade>| DeploymentPlan {
            namespace: "ml".into(),
            name: "big".into(),
            desired: 2,
            unplaced: 1,
            trade,
            ..Default::default()
        };
        let own =
            TierTrade { priority: 100, position: Some(1), tier_placed_before: 6, tier_placed_after: 9, gave_up: 1 };
        let text = super::explain_text(&plan(Some(own.clone())));
        assert!(text.contains("SAME-TIER TRADE"), "{text}");
        assert!(
            text.contains(
                "its tier, priority 100 solved in another order than creation order: 9 replica(s) of the tier placed \
                 instead of 6; this deployment solved 2nd"
            ),
            "{text}"
        );
        assert!(text.contains("1 replica(s) fewer than in creation order"), "{text}");
        let below = super::explain_text(&plan(Some(TierTrade { position: None, gave_up: 0, ..own })));
        assert!(below.contains("  a higher tier, priority 100"), "{below}");
        assert!(!below.contains("fewer than in creation order"), "nothing given up, nothing said: {below}");
        let quiet = super::explain_text(&plan(None));
        assert!(!quiet.contains("TRADE"), "{quiet}");
        assert_eq!(
            [1, 2, 3, 4, 11, 12, 13, 21, 22, 111].map(super::ordinal).join(" "),
            "1st 2nd 3rd 4th 11th 12th 13th 21st 22nd 111th"
        );
    }
}
