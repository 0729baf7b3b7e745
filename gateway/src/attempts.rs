//! One model's attempt loop as a pure state machine: `proxy` asks [`Attempts::next`] what to do
//! (send to a route, wait for one, give up), does it, and feeds back what happened
//! ([`Attempts::answered`], [`Attempts::skipped`], [`Attempts::failed`], which says how a failure
//! is judged); when the machine gives up, [`Attempts::verdict`] is the client's error. No I/O and
//! no clock: time, the routes' health and the backoff come in as arguments.
//!
//! The rule, per cluster of the model: a 500, or a 429 whose wait is at most
//! `--max-retry-after-ms`, is retried once on it (the 429 after its wait); a prefill the engine
//! refuses is retried as a regeneration; a 400/413/422 ends the loop with the upstream's own
//! answer; every other failure excludes the cluster for this request. Each retry waits its
//! backoff first; at most `--max-attempts` attempts, none after the deadline. A stream that
//! breaks after its first byte is continued through the same loop ([`after_stream`] decides
//! whether), at most `--max-continuations` times.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;

use crate::GatewayError;
use crate::config::{GatewayConfig, ms};
use crate::member::{self, ConfigReason};
use crate::metrics::{AbandonReason, StreamEnd};
use crate::upstream::Failure;

/// One route as the machine sees it, read from its health just before a decision.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RouteView {
    /// Both breakers let a request through and the entry point is not known to be misconfigured.
    pub(crate) available: bool,
    /// End of the model's 429 cool-down on the cluster.
    pub(crate) cooling_until: Option<Instant>,
    /// Why the cluster's entry point is misconfigured, if it is.
    pub(crate) fault: Option<ConfigReason>,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Attempt route `route` (an index into the routes), first sleeping `pause`: the backoff
    /// before a retry, none before the first attempt.
    Send {
        /// The route.
        route: usize,
        /// The backoff.
        pause: Option<Duration>,
    },
    /// No route is ready now: sleep until the soonest one is, then ask again.
    Wait(Instant),
    /// Stop trying: [`Attempts::verdict`] says what the client gets.
    GiveUp,
}

/// Why a chosen route got no attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    /// A continuation the route cannot take (no body for it): left out for this request.
    Unusable,
    /// Its half-open circuit admits one request and another request holds it: ask again.
    ProbeTaken,
}

/// How a failed attempt is judged: what its route's health is told, and what the request does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reaction {
    /// A wrong path (404 not from the engine), a refused credential (401/403) or certificate:
    /// the cluster's entry point is misconfigured (reported; neutral for the breakers).
    /// The cluster is left out.
    Misconfigured(ConfigReason),
    /// 429: neutral; the route cools down for the `Retry-After` given, if any. The cluster is
    /// retried once after the wait (`Retry-After`, else the backoff) when that is short, else
    /// left out.
    RateLimited {
        /// The upstream's `Retry-After`.
        cool_down: Option<Duration>,
    },
    /// A prefill continuation answered 400/422 (not a context-length error): neutral; the route
    /// is learnt to refuse prefill, so it may still regenerate.
    RefusesPrefill,
    /// 400, 413, 422: the upstream rejected the request itself; the loop ends, and the client
    /// gets the upstream's status and body.
    Rejected {
        /// The upstream's status.
        status: StatusCode,
        /// The upstream's body.
        body: Bytes,
        /// A context-length refusal, which the model's fallbacks may serve.
        context_length: bool,
    },
    /// Any other 4xx: neutral; the cluster is left out.
    ClientError,
    /// 500: a failure of the model's engine; the cluster is retried once.
    ServerError,
    /// Any other status, or a malformed answer: a failure of the model's engine; left out.
    EngineFailure,
    /// Connect error, reset, timeout: a failure of the cluster's transport; left out.
    TransportFailure,
}

/// The loop ended without an answer.
#[derive(Debug)]
pub(crate) struct GaveUp {
    /// What the client gets.
    pub(crate) error: GatewayError,
    /// Some attempt was sent (the requested model's error wins over a fallback never tried).
    pub(crate) attempted: bool,
}

/// The last failure, as much as the verdict needs of it.
#[derive(Debug)]
enum Last {
    RateLimited,
    Timeout(String),
    Other(String),
}

/// What this request did on one cluster.
#[derive(Clone, Copy, Debug, Default)]
struct Tried {
    failures: u32,
    excluded: bool,
    not_before: Option<Instant>,
}

/// The loop's settings, from the configuration.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    max_attempts: u32,
    max_wait: Duration,
    deadline: Instant,
    unavailable_retry_after_s: u64,
    retry_after_cap_s: u64,
}

/// One model's attempt loop. `B` is the backoff before retry `n` (1-based).
pub(crate) struct Attempts<'a, B> {
    /// The requested model (errors name it) and the model tried.
    origin: &'a str,
    model: &'a str,
    clusters: Vec<&'a str>,
    /// Per route, the first route to its cluster: a request remembers clusters, and two
    /// deployments of a split model may share one.
    slot: Vec<usize>,
    tried: Vec<Option<Tried>>,
    bounds: Bounds,
    backoff: B,
    attempts: u32,
    last: Option<Last>,
    /// The longest `Retry-After` a 429 gave (1 s for one without).
    rate_after: Duration,
}

impl<'a, B: FnMut(u32) -> Duration> Attempts<'a, B> {
    /// The loop of `model` (for a request of `origin`) over routes to `clusters`; a model with
    /// no route within its policy gives up at once.
    pub(crate) fn new(
        cfg: &GatewayConfig,
        (origin, model): (&'a str, &'a str),
        clusters: Vec<&'a str>,
        deadline: Instant,
        backoff: B,
    ) -> Result<Self, GaveUp> {
        let bounds = Bounds {
            max_attempts: cfg.max_attempts,
            max_wait: ms(cfg.max_retry_after_ms),
            deadline,
            unavailable_retry_after_s: cfg.unavailable_retry_after_s,
            retry_after_cap_s: cfg.retry_after_cap_s,
        };
        if clusters.is_empty() {
            let reason = format!("no ready cluster of `{model}` is within its policy");
            return Err(GaveUp { error: unavailable(origin, reason, &bounds), attempted: false });
        }
        let slot = clusters.iter().map(|c| clusters.iter().position(|o| o == c).unwrap_or(0)).collect();
        let tried = vec![None; clusters.len()];
        let last = None;
        Ok(Attempts {
            origin,
            model,
            clusters,
            slot,
            tried,
            bounds,
            backoff,
            attempts: 0,
            last,
            rate_after: Duration::ZERO,
        })
    }

    /// Attempts sent so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether this request attempted (or left out) the route's cluster.
    pub(crate) fn tried(&self, route: usize) -> bool {
        self.entry(route).is_some()
    }

    fn entry(&self, route: usize) -> Option<&Tried> {
        self.tried[self.slot[route]].as_ref()
    }

    fn entry_mut(&mut self, route: usize) -> &mut Tried {
        self.tried[self.slot[route]].get_or_insert_default()
    }

    fn excluded(&self, route: usize) -> bool {
        self.entry(route).is_some_and(|t| t.excluded)
    }

    /// The next step at `now`, given each route's health; `choose` picks among the routes ready
    /// now (told which this request tried), and finding none gives up.
    pub(crate) fn next(
        &mut self,
        now: Instant,
        views: &[RouteView],
        choose: impl FnOnce(Vec<usize>, &dyn Fn(usize) -> bool) -> Option<usize>,
    ) -> Step {
        let b = self.bounds;
        if self.attempts >= b.max_attempts || now >= b.deadline {
            return Step::GiveUp;
        }
        let eligible: Vec<usize> = (0..views.len()).filter(|&i| !self.excluded(i) && views[i].available).collect();
        let ready_at = |i: usize| views[i].cooling_until.max(self.entry(i).and_then(|t| t.not_before));
        let ready_now: Vec<usize> =
            eligible.iter().copied().filter(|&i| ready_at(i).is_none_or(|t| t <= now)).collect();
        if ready_now.is_empty() {
            // Wait for the soonest route only when it is ready soon enough, and before the deadline.
            return match eligible.iter().filter_map(|&i| ready_at(i)).min() {
                Some(until) if until < b.deadline && until - now <= b.max_wait => Step::Wait(until),
                _ => Step::GiveUp,
            };
        }
        let Some(route) = choose(ready_now, &|i| self.tried(i)) else { return Step::GiveUp };
        let n = self.attempts;
        let pause = (n > 0).then(|| (self.backoff)(n).min(b.deadline.saturating_duration_since(now)));
        Step::Send { route, pause }
    }

    /// The route got no attempt.
    pub(crate) fn skipped(&mut self, route: usize, why: Skip) {
        match why {
            Skip::Unusable => self.entry_mut(route).excluded = true,
            Skip::ProbeTaken => {}
        }
    }

    /// The attempt got a usable answer: the loop ends with it.
    pub(crate) fn answered(&mut self) {
        self.attempts += 1;
    }

    /// The attempt on `route` failed at `now` (`prefill`: it was a prefill continuation): how
    /// it is judged, with this request's memory of the cluster updated.
    pub(crate) fn failed(&mut self, route: usize, failure: &Failure, prefill: bool, now: Instant) -> Reaction {
        self.attempts += 1;
        let reaction = judge(failure, prefill);
        let wait = match &reaction {
            Reaction::RateLimited { cool_down } => cool_down.unwrap_or_else(|| (self.backoff)(self.attempts)),
            _ => Duration::ZERO,
        };
        let max_wait = self.bounds.max_wait;
        let t = self.entry_mut(route);
        t.failures += 1;
        match &reaction {
            Reaction::RateLimited { .. } if wait > max_wait || t.failures >= 2 => t.excluded = true,
            Reaction::RateLimited { .. } => t.not_before = Some(now + wait),
            Reaction::ServerError => t.excluded = t.failures >= 2,
            Reaction::RefusesPrefill | Reaction::Rejected { .. } => {}
            Reaction::Misconfigured(_)
            | Reaction::ClientError
            | Reaction::EngineFailure
            | Reaction::TransportFailure => t.excluded = true,
        }
        if let Reaction::RateLimited { cool_down } = &reaction {
            self.rate_after = self.rate_after.max(cool_down.unwrap_or(Duration::from_secs(1)));
        }
        self.last = Some(match failure {
            Failure::Status { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => Last::RateLimited,
            Failure::Timeout(_) => Last::Timeout(failure.describe()),
            _ => Last::Other(failure.describe()),
        });
        reaction
    }

    /// What the client gets after the machine gave up, given each route's health at `now`.
    pub(crate) fn verdict(&self, now: Instant, views: &[RouteView]) -> GaveUp {
        let attempted = self.attempts > 0;
        if let Some(error) = self.misconfigured(views) {
            return GaveUp { error, attempted };
        }
        let open = |i: usize| self.excluded(i) || !views[i].available;
        let exhausted = (0..views.len()).all(open);
        // `Some` when every route still open to this request is cooling down after a 429.
        let cooling: Option<Duration> = (0..views.len())
            .filter(|&i| !open(i))
            .map(|i| views[i].cooling_until.filter(|t| *t > now).map(|t| t - now))
            .try_fold(Duration::ZERO, |longest, left| left.map(|l| longest.max(l)));
        let model = self.model;
        let error = match &self.last {
            // Rate limited: that is the answer, with the longest Retry-After given, never a 503.
            Some(Last::RateLimited) => self.rate_limited(self.rate_after.max(cooling.unwrap_or_default())),
            None => match cooling {
                Some(wait) if !wait.is_zero() => self.rate_limited(wait),
                _ => self
                    .unavailable(format!("every allowed cluster of `{model}` has an open circuit or is cooling down")),
            },
            Some(Last::Timeout(f) | Last::Other(f)) if exhausted => {
                self.unavailable(format!("every allowed cluster of `{model}` failed; last: {f}"))
            }
            Some(Last::Timeout(f)) => GatewayError::UpstreamTimeout { model: self.origin.into(), reason: f.clone() },
            Some(Last::Other(f)) => GatewayError::Upstream { model: self.origin.into(), reason: f.clone() },
        };
        GaveUp { error, attempted }
    }

    /// Every route's entry point is misconfigured: that, without a Retry-After.
    fn misconfigured(&self, views: &[RouteView]) -> Option<GatewayError> {
        let faults: Vec<String> = (0..views.len())
            .filter_map(|i| views[i].fault.map(|reason| format!("{}: {reason:?}", self.clusters[i])))
            .collect();
        (faults.len() == views.len())
            .then(|| GatewayError::UpstreamMisconfigured { model: self.origin.into(), detail: faults.join(", ") })
    }

    fn rate_limited(&self, wait: Duration) -> GatewayError {
        GatewayError::RateLimited {
            model: self.origin.into(),
            retry_after: (wait.as_secs_f64().ceil() as u64).clamp(1, self.bounds.retry_after_cap_s.max(1)),
        }
    }

    fn unavailable(&self, reason: String) -> GatewayError {
        unavailable(self.origin, reason, &self.bounds)
    }
}

fn unavailable(origin: &str, reason: String, b: &Bounds) -> GatewayError {
    GatewayError::NoHealthyCluster { model: origin.into(), reason, retry_after: b.unavailable_retry_after_s }
}

/// How a failure is judged: a certificate refused is a misconfigured entry point, a cluster
/// that did not answer a transport failure, a malformed answer the engine's failure; a status
/// as [`judge_status`] says.
pub(crate) fn judge(failure: &Failure, prefill: bool) -> Reaction {
    match failure {
        Failure::Tls(_) => Reaction::Misconfigured(ConfigReason::UpstreamTls),
        Failure::Connect(_) | Failure::Reset(_) | Failure::Timeout(_) => Reaction::TransportFailure,
        Failure::Malformed(_) => Reaction::EngineFailure,
        Failure::Status { status, retry_after, body } => judge_status(*status, *retry_after, body, prefill),
    }
}

/// How a non-success status is judged, first match wins: the entry point misconfigured, rate
/// limited, a refused prefill, the request rejected, another client error, a 500, anything else.
fn judge_status(status: StatusCode, retry_after: Option<Duration>, body: &Bytes, prefill: bool) -> Reaction {
    if let Some(reason) = member::config_fault(status, body) {
        return Reaction::Misconfigured(reason);
    }
    match status.as_u16() {
        429 => Reaction::RateLimited { cool_down: retry_after },
        400 | 422 if prefill && !is_context_length(body) => Reaction::RefusesPrefill,
        400 | 413 | 422 => Reaction::Rejected { status, body: body.clone(), context_length: is_context_length(body) },
        _ if status.is_client_error() => Reaction::ClientError,
        500 => Reaction::ServerError,
        _ => Reaction::EngineFailure,
    }
}

/// What a streamed answer does when its upstream stream ended after the first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterStream {
    /// The stream ends here: whole, or with the error event its end calls for.
    End,
    /// A break that is not continued: the stream ends with its error event, for this reason.
    Abandon(AbandonReason),
    /// Continue it on another route: the model chain and attempt loop again, for a continuation.
    Continue,
}

/// After a stream ended with `end`, having been `continued` times out of `max`: a continuation
/// that diverged is abandoned; a clean end, or a break of a stream that kept no text
/// (`recorded`), ends it; a break is continued unless the answer cannot be (`resumable`) or the
/// continuations are spent.
pub(crate) fn after_stream(end: StreamEnd, recorded: bool, resumable: bool, continued: u32, max: u32) -> AfterStream {
    if end == StreamEnd::diverged {
        return AfterStream::Abandon(AbandonReason::diverged);
    }
    if !end.broken() || !recorded {
        return AfterStream::End;
    }
    if !resumable {
        return AfterStream::Abandon(AbandonReason::unsupported);
    }
    if continued >= max {
        return AfterStream::Abandon(AbandonReason::limit);
    }
    AfterStream::Continue
}

/// Whether an upstream's client-error body says the prompt is longer than the model's context.
pub(crate) fn is_context_length(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("context_length_exceeded") || text.contains("maximum context length")
}

#[cfg(test)]
#[path = "attempts_tests.rs"]
mod tests;
