//! Why placing one replica on a candidate failed, kept as the numbers of the moment and said in
//! words only for the refusals a plan reports. Placing walks a deployment's candidates for every
//! replica, so a busy fleet refuses millions of times a solve; formatting each refusal when it
//! happened was a fifth of a large solve's time.

use flotilla_apis::common::format_price_micros;
use flotilla_apis::deployment::SpreadDomain;

use super::Ctx;
use crate::devices::{ReplicaShape, misfit_of};
use crate::plan::Reason;

/// One refusal of `place`, with what its words need.
#[derive(Clone, Debug)]
pub(super) enum Refusal {
    /// The alternative of fallback rank `rank` already has `max` replicas (`maxReplicas`).
    AlternativeMax { rank: u32, max: i32 },
    /// One more replica at `price` over `placed` would pass the ceiling `max` (per hour).
    Ceiling { price: u64, placed: u64, max: u64 },
    /// One more replica would leave the ceiling too little for the rest of the target
    /// (`ceiling.rs`'s hold).
    Reserve { price: u64, placed: u64, max: u64 },
    /// The domain would have `count` replicas, the emptiest `min`.
    Spread { by: SpreadDomain, domain: usize, count: u32, min: u32, skew: u32 },
    /// The pool's free devices could not hold the replica: what they were then
    /// ([`free_facts`](crate::devices::free_facts)).
    Misfit { pool: usize, free: (u32, u32, u32) },
    /// One more replica, adding `add`, would take the namespace past limit `device` (`None`:
    /// the cost limit) of `max` of quota `quota` (index in `FleetSnapshot::quotas`), with
    /// `used` held.
    Quota { quota: usize, device: Option<usize>, max: u64, used: u64, add: u64 },
}

impl Ctx<'_, '_> {
    /// The reason and words of `refusal` on cluster `ci`, for a deployment of `shape`.
    pub(super) fn said(&self, ci: usize, refusal: &Refusal, shape: &ReplicaShape) -> (Reason, String) {
        match refusal {
            Refusal::AlternativeMax { rank, max } => {
                (Reason::AlternativeMaxReached, format!("alternative {rank} has maxReplicas {max}"))
            }
            Refusal::Ceiling { price, placed, max } => (
                Reason::CostCeilingExceeded,
                format!(
                    "one more replica here costs ${}/h; placed so far ${}/h, ceiling ${}/h",
                    format_price_micros(*price),
                    format_price_micros(*placed),
                    format_price_micros(*max)
                ),
            ),
            Refusal::Reserve { price, placed, max } => (
                Reason::CostCeilingExceeded,
                format!(
                    "one more replica here costs ${}/h; with ${}/h placed, the ceiling ${}/h would then not pay for \
                     the rest at the cheapest free capacity",
                    format_price_micros(*price),
                    format_price_micros(*placed),
                    format_price_micros(*max)
                ),
            ),
            Refusal::Spread { by, domain, count, min, skew } => {
                let key = self.domains.of(*by).1.get(*domain).map_or("", String::as_str);
                (
                    Reason::SpreadConstraint,
                    format!("{key} would have {count} replicas, the emptiest domain {min}; maxSkew {skew}"),
                )
            }
            Refusal::Misfit { pool, free } => {
                let pool = &self.snapshot.clusters[ci].pools[*pool];
                let per_node = self.snapshot.classes.get(&pool.class).map_or(0, |c| c.devices_per_node());
                let (reason, msg) = misfit_of(shape, *free, per_node);
                (reason, format!("pool {}: {msg}", pool.name))
            }
            Refusal::Quota { quota, device, max, used, add } => {
                (Reason::QuotaExceeded, super::quota::said(self.snapshot, *quota, *device, *max, *used, *add))
            }
        }
    }
}
