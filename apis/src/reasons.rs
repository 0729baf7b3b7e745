//! The documentation of every condition type and condition reason in [`crate::constants`],
//! available at run time: per kind, what each condition says, and per (kind, reason) which
//! conditions carry it, what it means and what to do about it. `docs/api.md` is rendered from
//! these tables and from the CRDs (see `placement/tests/api_doc.rs`); a test below fails when
//! a constant of `constants::condition` or `constants::reason` has no entry here.

use crate::constants::condition;

mod table;

pub use table::ALL;

/// `InferenceClass`.
pub const INFERENCE_CLASS: &str = "InferenceClass";
/// `InferenceCluster`.
pub const INFERENCE_CLUSTER: &str = "InferenceCluster";
/// `ModelDeployment`.
pub const MODEL_DEPLOYMENT: &str = "ModelDeployment";
/// `ModelCache`.
pub const MODEL_CACHE: &str = "ModelCache";
/// `CapacityClaim`.
pub const CAPACITY_CLAIM: &str = "CapacityClaim";
/// `FleetQuota`.
pub const FLEET_QUOTA: &str = "FleetQuota";

/// Who writes a kind's status, in this release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindDoc {
    /// The kind.
    pub kind: &'static str,
    /// Which component writes `status`, and when.
    pub writer: &'static str,
}

/// Status writers per kind, in the order of [`crate::crd::all`].
pub const KINDS: &[KindDoc] = &[
    KindDoc {
        kind: INFERENCE_CLASS,
        writer: "No component of this release writes InferenceClass status yet; `status` stays empty. The \
                 solver and the InferenceCluster controller read the spec directly.",
    },
    KindDoc {
        kind: INFERENCE_CLUSTER,
        writer: "`flotilla-controller` (`controllers/src/cluster.rs`), on every poll (`--poll-seconds`, 10 s by \
                 default), only when something changed; `lastHeartbeat` advances at most every 5 minutes \
                 otherwise. See [controllers.md](controllers.md#inferencecluster).",
    },
    KindDoc {
        kind: MODEL_DEPLOYMENT,
        writer: "`flotilla-controller` (`controllers/src/deployment/`) writes `Placed`, `CapacityAvailable`, \
                 `Ready`, `Degraded`, placements and `unplaced`; the gateway's elected replica \
                 (`gateway/src/feedback.rs`) writes `Serving`. Both write only on change. See \
                 [controllers.md](controllers.md#modeldeployment) and [gateway.md](gateway.md).",
    },
    KindDoc {
        kind: MODEL_CACHE,
        writer: "`flotilla-controller` (`controllers/src/cache/`): per target cluster a volume and a staging Job; \
                 the per-cluster reasons (`status.clusters[].reason`) are those the staging program \
                 `flotilla-stage` reports (`StageResult::verdict`), or `JobFailed`; written only on change. See \
                 [controllers.md](controllers.md#modelcache) and [staging.md](staging.md#reasons-and-exit-codes).",
    },
    KindDoc {
        kind: CAPACITY_CLAIM,
        writer: "`flotilla-controller` (`controllers/src/claim/`) when started with a capacity provider \
                 (`--sim-cloud`); it runs the claim engine of `flotilla-providers`, writes status only when the \
                 step changed it, and releases the capacity through the `flotilla.dev/capacity-release` \
                 finalizer. `Fulfilled` and `Ready` carry the same status and reason. See \
                 [providers.md](providers.md).",
    },
    KindDoc {
        kind: FLEET_QUOTA,
        writer: "`flotilla-controller` (`controllers/src/quota.rs`), from the plan of every solve: usage per limit, \
                 the namespace's cost, the replicas the quota leaves unplaced, `Ready` and `Exhausted`; written only \
                 on change. The solver enforces the limits whether or not the status is written. See \
                 [placement.md](placement.md#fleet-quotas).",
    },
];

/// One condition type on one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionDoc {
    /// The constant's name in [`crate::constants::condition`] (`CAPACITY_KNOWN`).
    pub constant: &'static str,
    /// The condition type as written (`CapacityKnown`).
    pub type_: &'static str,
    /// The kind that carries it.
    pub kind: &'static str,
    /// What `True` means, and what `False` means.
    pub meaning: &'static str,
}

/// One reason on one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasonDoc {
    /// The constant's name in [`crate::constants::reason`] (`SECRET_MISSING`).
    pub constant: &'static str,
    /// The reason as written (`SecretMissing`).
    pub reason: &'static str,
    /// The kind whose conditions carry it.
    pub kind: &'static str,
    /// The conditions (with their status) that carry it (`` `Ready`=False, `Degraded`=True ``),
    /// prefixed `reserved: ` (or just `reserved`) when no component of this release writes it yet.
    pub conditions: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// What to do about it.
    pub action: &'static str,
}

macro_rules! c {
    ($kind:expr, $c:ident, $meaning:expr) => {
        ConditionDoc { constant: stringify!($c), type_: condition::$c, kind: $kind, meaning: $meaning }
    };
}

/// Every condition type, per kind, in the order users read them.
pub const CONDITIONS: &[ConditionDoc] = &[
    c!(INFERENCE_CLASS, READY, "True: the class is valid and pools can use it (reserved: not written yet)."),
    c!(
        INFERENCE_CLUSTER,
        REACHABLE,
        "True: the member's API server answered with the credentials from `spec.credentials.secretRef` \
         or from the ClusterProfile's exec plugin. False: the Secret or ClusterProfile is missing or \
         unusable, the plugin failed, the credentials were refused, or the member did not answer."
    ),
    c!(
        INFERENCE_CLUSTER,
        CAPACITY_KNOWN,
        "True: capacity was observed for at least one declared pool. False: no pool has ready nodes, or a pool \
         names an unknown class. Unknown: the member could not be observed."
    ),
    c!(
        INFERENCE_CLUSTER,
        READY,
        "True: reachable and capacity observed; only Ready clusters are offered to the solver and the gateway. \
         False: carries the reason of the condition that is not True."
    ),
    c!(
        MODEL_DEPLOYMENT,
        PLACED,
        "True: every replica (and every alternative's `minReplicas`) has a place in the plan. False: some do \
         not; `status.unplaced.reasons` says why each cluster refused."
    ),
    c!(
        MODEL_DEPLOYMENT,
        CAPACITY_AVAILABLE,
        "True: the fleet has room for every replica. False: some replicas need capacity the fleet does not have."
    ),
    c!(
        MODEL_DEPLOYMENT,
        READY,
        "True: every desired replica is observed ready in its member cluster (or the deployment is scaled to \
         zero). Never True on partial evidence: 1 of 8 ready is False and `Degraded`."
    ),
    c!(
        MODEL_DEPLOYMENT,
        SERVING,
        "Written by the gateway. True: requests for the model are routed (`Degraded` when some clusters are \
         troubled). False: requests get 503."
    ),
    c!(
        MODEL_DEPLOYMENT,
        DEGRADED,
        "True: some but not all desired replicas are ready, or an apply to a member failed. False otherwise."
    ),
    c!(
        MODEL_DEPLOYMENT,
        WAITING_FOR_CACHE,
        "True: replicas wait for `spec.model.cacheRef` to be Ready in their cluster (reserved: not written yet)."
    ),
    c!(MODEL_CACHE, ACCEPTED, "True: the spec is valid and accepted (reserved: not written yet)."),
    c!(
        MODEL_CACHE,
        STAGED,
        "True: the weights are staged and their digest verified in every target cluster (reserved: not written yet)."
    ),
    c!(
        MODEL_CACHE,
        READY,
        "True: staged and verified everywhere; a cache is Ready in a cluster only after its digest was verified \
         there (reserved: not written yet)."
    ),
    c!(CAPACITY_CLAIM, ACCEPTED, "True: the spec is valid and accepted (reserved: not written yet)."),
    c!(
        CAPACITY_CLAIM,
        PROVISIONING,
        "True: nodes were asked for and are not ready yet. False: no provider request is in flight; carries the \
         same reason as `Fulfilled`."
    ),
    c!(CAPACITY_CLAIM, FULFILLED, "True: every pod set has the capacity it asked for."),
    c!(CAPACITY_CLAIM, READY, "Mirrors `Fulfilled`."),
    c!(
        FLEET_QUOTA,
        READY,
        "True: the quota is valid and every solve enforces it. False: the spec is invalid (an unknown class); \
         the message names the field, and the solver still enforces the limits it can read."
    ),
    c!(
        FLEET_QUOTA,
        EXHAUSTED,
        "True: a limit binds — replicas of the namespace are unplaced because of it (`QuotaExceeded`), or \
         usage is exactly at a limit (`AtLimit`). False: every limit has room."
    ),
    c!(
        CAPACITY_CLAIM,
        SURPLUS,
        "True: the claim holds more nodes than its pod sets need (the count went down, or the claim is being \
         deleted) and `spec.disruption` keeps them for now (`ConsolidationBlocked`, `DrainRequired`) or a \
         release failed. False (`AsExpected`): it holds no more than it needs."
    ),
];

/// The conditions of one kind.
pub fn conditions_of(kind: &str) -> impl Iterator<Item = &'static ConditionDoc> + '_ {
    CONDITIONS.iter().filter(move |c| c.kind == kind)
}

/// The reasons of one kind, in table order.
pub fn reasons_of(kind: &str) -> impl Iterator<Item = &'static ReasonDoc> + '_ {
    ALL.iter().filter(move |r| r.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constants::reason;

    /// The `(NAME, "Value")` pairs of every `pub const` in `pub mod <module>` of
    /// `constants.rs`, read from its source (a declaration may span lines).
    fn constants_in(module: &str) -> Vec<(String, String)> {
        let source = include_str!("constants.rs");
        let header = format!("pub mod {module} {{");
        let Some(start) = source.find(&header) else { return Vec::new() };
        let body = &source[start + header.len()..];
        let body = &body[..body.find("\n}").unwrap_or(body.len())];
        body.split("pub const ")
            .skip(1)
            .filter_map(|decl| {
                let decl = &decl[..decl.find(';')?];
                let (name, rest) = decl.split_once(':')?;
                let value = rest.split_once('"')?.1.split_once('"')?.0;
                Some((name.trim().to_string(), value.to_string()))
            })
            .collect()
    }

    #[test]
    fn every_reason_constant_is_documented() {
        let consts = constants_in("reason");
        assert!(consts.len() >= 40, "parsed only {} reason constants", consts.len());
        for (name, value) in consts {
            let rows: Vec<_> = ALL.iter().filter(|r| r.constant == name).collect();
            assert!(!rows.is_empty(), "reason::{name} ({value}) has no entry in reasons::ALL");
            assert!(rows.iter().all(|r| r.reason == value), "{name}");
        }
    }

    #[test]
    fn every_condition_constant_is_documented() {
        let consts = constants_in("condition");
        assert!(consts.len() >= 10);
        for (name, value) in consts {
            assert!(CONDITIONS.iter().any(|c| c.constant == name && c.type_ == value), "condition::{name}");
        }
    }

    #[test]
    fn rows_are_complete_unique_and_name_known_kinds() {
        let kinds: Vec<_> = KINDS.iter().map(|k| k.kind).collect();
        let mut seen = std::collections::BTreeSet::new();
        for r in ALL {
            assert!(kinds.contains(&r.kind), "{}", r.kind);
            assert!(seen.insert((r.kind, r.reason)), "{} {} twice", r.kind, r.reason);
            for text in [r.conditions, r.meaning, r.action] {
                assert!(!text.trim().is_empty() && !text.contains('|') && !text.contains('\n'), "{}", r.reason);
            }
        }
        for c in CONDITIONS {
            assert!(kinds.contains(&c.kind), "{}", c.kind);
        }
        for k in &kinds {
            assert!(conditions_of(k).any(|c| c.type_ == condition::READY), "{k} lacks Ready");
            assert!(reasons_of(k).any(|r| r.reason == reason::AS_EXPECTED), "{k}");
        }
    }

    #[test]
    fn a_reason_on_a_kind_names_only_that_kinds_conditions() {
        for r in ALL.iter().filter(|r| !r.conditions.starts_with("reserved")) {
            for part in r.conditions.split(", ") {
                let type_ = part.trim_matches('`').split('`').next().unwrap_or_default();
                assert!(
                    conditions_of(r.kind).any(|c| c.type_ == type_) || type_.starts_with("status."),
                    "{} on {}: {type_} is not a condition of the kind",
                    r.reason,
                    r.kind
                );
            }
        }
    }
}
