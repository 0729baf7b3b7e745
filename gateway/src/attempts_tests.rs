//! Tests of the attempt loop's decisions, without servers: how each failure is judged
//! ([`judge`]), which step follows a script of outcomes ([`Attempts::next`]), what the
//! client gets when the loop gives up ([`Attempts::verdict`]), and whether a stream that ended
//! is continued ([`after_stream`]). Each case names the branch of the
//! loop it covers; every route is available and cool unless the case says otherwise.

use super::*;

const CONNECT: fn() -> Failure = || Failure::Connect("refused".into());
const RESET: fn() -> Failure = || Failure::Reset("closed".into());
const TIMEOUT: fn() -> Failure = || Failure::Timeout("first token");
const MALFORMED: fn() -> Failure = || Failure::Malformed("not JSON".into());

fn status(code: u16, retry_after: Option<u64>, body: &str) -> Failure {
    Failure::Status {
        status: StatusCode::from_u16(code).unwrap(),
        retry_after: retry_after.map(Duration::from_millis),
        body: Bytes::from(body.to_string()),
    }
}

fn code(c: u16) -> Failure {
    status(c, None, "")
}

/// A 429 with `Retry-After` in milliseconds, if any.
fn busy(retry_after: Option<u64>) -> Failure {
    status(429, retry_after, "")
}

const CONTEXT: &str =
    r#"{"error":{"message":"This model's maximum context length is 4096 tokens","code":"context_length_exceeded"}}"#;
const ENGINE_404: &str = r#"{"error":{"message":"The model `x` does not exist.","type":"NotFoundError"}}"#;

/// Each branch of [`judge`]: the case's name, the failure, whether it was a prefill, the verdict.
fn judgements() -> Vec<(&'static str, Failure, bool, Reaction)> {
    use ConfigReason::*;
    use Reaction::*;
    let rejected = |c: u16, body: &str, context_length| Rejected {
        status: StatusCode::from_u16(c).unwrap(),
        body: Bytes::from(body.to_string()),
        context_length,
    };
    let tls = Failure::Tls("unknown issuer".into());
    vec![
        ("tls: a refused certificate, a misconfigured entry point", tls, false, Misconfigured(UpstreamTls)),
        ("404 without an engine's body: a wrong path", code(404), false, Misconfigured(UpstreamNotFound)),
        ("401: a refused credential", code(401), false, Misconfigured(UpstreamUnauthorized)),
        ("403: a refused credential, even for a prefill", code(403), true, Misconfigured(UpstreamUnauthorized)),
        ("429 with Retry-After", busy(Some(2000)), false, RateLimited { cool_down: Some(ms_(2000)) }),
        ("429 without Retry-After, even for a prefill", busy(None), true, RateLimited { cool_down: None }),
        ("prefill answered 400: refused prefill", code(400), true, RefusesPrefill),
        ("prefill answered 422: refused prefill", code(422), true, RefusesPrefill),
        (
            "prefill answered a context-length 400: rejected",
            status(400, None, CONTEXT),
            true,
            rejected(400, CONTEXT, true),
        ),
        ("prefill answered 413: rejected", code(413), true, rejected(413, "", false)),
        ("400: rejected", status(400, None, "{}"), false, rejected(400, "{}", false)),
        ("422: rejected", code(422), false, rejected(422, "", false)),
        (
            "400 context length: rejected, a fallback may serve",
            status(400, None, CONTEXT),
            false,
            rejected(400, CONTEXT, true),
        ),
        ("404 with an engine's body: a client error", status(404, None, ENGINE_404), false, ClientError),
        ("409: a client error", code(409), false, ClientError),
        ("500: a server error", code(500), false, ServerError),
        ("502: the engine's failure", code(502), false, EngineFailure),
        ("503 with Retry-After: the engine's failure", status(503, Some(1000), ""), false, EngineFailure),
        ("504: the engine's failure", code(504), false, EngineFailure),
        ("302: the engine's failure", code(302), false, EngineFailure),
        ("malformed answer: the engine's failure", MALFORMED(), false, EngineFailure),
        ("connect error: the transport's failure", CONNECT(), false, TransportFailure),
        ("reset: the transport's failure", RESET(), false, TransportFailure),
        ("timeout: the transport's failure", TIMEOUT(), false, TransportFailure),
    ]
}

#[test]
fn each_failure_is_judged_by_its_branch() {
    for (name, failure, prefill, want) in judgements() {
        assert_eq!(judge(&failure, prefill), want, "{name}");
    }
}

/// What happens on the way: an outcome fed to the machine at the start (`t0`).
enum Ev {
    /// A failed attempt on the route.
    Fail(usize, Failure),
    /// A failed prefill continuation on the route.
    Prefill(usize, Failure),
    /// The route got no attempt.
    Skipped(usize, Skip),
    /// An attempt answered.
    Answered,
}

const ABC: &[&str] = &["a", "b", "c"];
const AB: &[&str] = &["a", "b"];
const A: &[&str] = &["a"];

fn ms_(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn up() -> RouteView {
    RouteView { available: true, cooling_until: None, fault: None }
}

/// A route whose circuit is open.
fn down() -> RouteView {
    RouteView { available: false, ..up() }
}

/// A route cooling down after a 429 (of this request or another).
fn cooling(until: Instant) -> RouteView {
    RouteView { cooling_until: Some(until), ..up() }
}

/// A route whose cluster's entry point is misconfigured.
fn faulty(reason: ConfigReason) -> RouteView {
    RouteView { fault: Some(reason), ..down() }
}

type Machine = Attempts<'static, fn(u32) -> Duration>;

/// The loop over `clusters`: at most 3 attempts, 60 s to the deadline, waits up to 5 s, retry
/// `n` backs off `n`·100 ms, `Retry-After` to clients capped at 120 s.
fn machine(clusters: &'static [&'static str], t0: Instant, script: Vec<Ev>) -> Machine {
    let mut cfg = GatewayConfig::with_table("t.yaml");
    (cfg.max_attempts, cfg.max_retry_after_ms, cfg.unavailable_retry_after_s, cfg.retry_after_cap_s) =
        (3, 5000, 1, 120);
    let backoff: fn(u32) -> Duration = |n| ms_(100 * u64::from(n));
    let mut m = Attempts::new(&cfg, ("asked", "served"), clusters.to_vec(), t0 + ms_(60_000), backoff).unwrap();
    for ev in script {
        match ev {
            Ev::Fail(i, f) => drop(m.failed(i, &f, false, t0)),
            Ev::Prefill(i, f) => drop(m.failed(i, &f, true, t0)),
            Ev::Skipped(i, why) => m.skipped(i, why),
            Ev::Answered => m.answered(),
        }
    }
    m
}

/// The chooser of the real loop in outline: a route this request has not tried first.
fn untried_first(ready: Vec<usize>, tried: &dyn Fn(usize) -> bool) -> Option<usize> {
    ready.iter().copied().find(|&i| !tried(i)).or(ready.first().copied())
}

/// A script of outcomes, then the step asked for `at` ms after the start.
struct Case {
    name: &'static str,
    clusters: &'static [&'static str],
    script: Vec<Ev>,
    /// The routes' health when the step is asked (default: every route up and cool).
    views: fn(Instant) -> Vec<RouteView>,
    at: u64,
    want: fn(Instant) -> Step,
}

fn step(name: &'static str, clusters: &'static [&'static str], script: Vec<Ev>, want: fn(Instant) -> Step) -> Case {
    Case { name, clusters, script, views: |_| vec![up(); 3], at: 0, want }
}

impl Case {
    fn at(self, at: u64) -> Self {
        Case { at, ..self }
    }
    fn views(self, views: fn(Instant) -> Vec<RouteView>) -> Self {
        Case { views, ..self }
    }
}

fn send(route: usize, pause: Option<u64>) -> Step {
    Step::Send { route, pause: pause.map(ms_) }
}

fn give_up(_: Instant) -> Step {
    Step::GiveUp
}

/// What follows each kind of failure (each route up and cool).
fn steps_after_failures() -> Vec<Case> {
    use Ev::*;
    let (retry_a, retry_b) = (|_| send(0, Some(100)), |_| send(1, Some(100)));
    vec![
        step("first attempt: sent at once, without a pause", AB, vec![], |_| send(0, None)),
        step("connect error: the next cluster, after retry 1's backoff", AB, vec![Fail(0, CONNECT())], retry_b),
        step("backoff grows with each retry", ABC, vec![Fail(0, CONNECT()), Fail(1, RESET())], |_| send(2, Some(200))),
        step("every cluster failed: give up", AB, vec![Fail(0, CONNECT()), Fail(1, TIMEOUT())], give_up),
        step("500 once: the cluster may be retried", A, vec![Fail(0, code(500))], retry_a),
        step("500 once: an untried cluster first", AB, vec![Fail(0, code(500))], retry_b),
        step("500 twice on one cluster: left out", A, vec![Fail(0, code(500)), Fail(0, code(500))], give_up),
        step(
            "500 after a 429 on one cluster: its 2nd failure, out",
            A,
            vec![Fail(0, busy(Some(10))), Fail(0, code(500))],
            give_up,
        ),
        step("503: left out at once", A, vec![Fail(0, code(503))], give_up),
        step("malformed answer: left out", A, vec![Fail(0, MALFORMED())], give_up),
        step("timeout: left out", A, vec![Fail(0, TIMEOUT())], give_up),
        step("another client error: left out", A, vec![Fail(0, status(404, None, ENGINE_404))], give_up),
        step("misconfigured entry point: left out", AB, vec![Fail(0, code(404))], retry_b),
        step("refused prefill: the cluster stays, to regenerate", A, vec![Prefill(0, code(400))], retry_a),
        step("429, short Retry-After, no other cluster: wait for it", A, vec![Fail(0, busy(Some(2000)))], |t0| {
            Step::Wait(t0 + ms_(2000))
        }),
        step("429 with a short Retry-After: another cluster first", AB, vec![Fail(0, busy(Some(2000)))], retry_b),
        step("429 after its wait: the same cluster again", A, vec![Fail(0, busy(Some(2000)))], retry_a).at(2000),
        step("429 without Retry-After: wait for the backoff", A, vec![Fail(0, busy(None))], |t0| {
            Step::Wait(t0 + ms_(100))
        }),
        step("429, Retry-After over --max-retry-after-ms: left out", A, vec![Fail(0, busy(Some(5001)))], give_up),
        step("429 twice on one cluster: left out", A, vec![Fail(0, busy(Some(10))), Fail(0, busy(Some(10)))], give_up),
        step("an answer counts as an attempt", A, vec![Answered], retry_a),
        step(
            "two deployments' routes to one cluster share its record",
            &["a", "a", "b"],
            vec![Fail(0, CONNECT())],
            |_| send(2, Some(100)),
        ),
    ]
}

/// What the routes' health, the bounds and routes without an attempt lead to.
fn steps_by_health_and_bounds() -> Vec<Case> {
    use Ev::*;
    let three_failures = vec![Fail(0, CONNECT()), Fail(1, code(500)), Fail(2, code(500))];
    let unusable = |i| Skipped(i, Skip::Unusable);
    vec![
        step("cooling after another request's 429: wait when soon", A, vec![], |t0| Step::Wait(t0 + ms_(3000)))
            .views(|t0| vec![cooling(t0 + ms_(3000))]),
        step("cooling longer than --max-retry-after-ms: give up", A, vec![], give_up)
            .views(|t0| vec![cooling(t0 + ms_(5001))]),
        step("cooling until the deadline: give up", A, vec![], give_up)
            .views(|t0| vec![cooling(t0 + ms_(60_000))])
            .at(58_000),
        step("every circuit open: give up", AB, vec![], give_up).views(|_| vec![down(), down()]),
        step("an open circuit is passed over", AB, vec![], |_| send(1, None)).views(|_| vec![down(), up()]),
        step("attempt budget spent: give up", ABC, three_failures, give_up),
        step("deadline passed: give up", A, vec![], give_up).at(60_000),
        step("a backoff never runs past the deadline", AB, vec![Fail(0, CONNECT())], |_| send(1, Some(50))).at(59_950),
        step("a continuation a cluster cannot take: left out, not counted", AB, vec![unusable(0)], |_| send(1, None)),
        step("no cluster can take the continuation: give up", AB, vec![unusable(0), unusable(1)], give_up),
        step("half-open slot taken: asked again, nothing counted", A, vec![Skipped(0, Skip::ProbeTaken)], |_| {
            send(0, None)
        }),
    ]
}

#[test]
fn each_outcome_leads_to_its_next_step() {
    for c in steps_after_failures().into_iter().chain(steps_by_health_and_bounds()) {
        let t0 = Instant::now();
        let sent = c.script.iter().filter(|e| !matches!(e, Ev::Skipped(..))).count() as u32;
        let mut m = machine(c.clusters, t0, c.script);
        let mut views = (c.views)(t0);
        views.truncate(c.clusters.len());
        let got = m.next(t0 + ms_(c.at), &views, untried_first);
        assert_eq!(got, (c.want)(t0), "{}", c.name);
        assert_eq!(m.attempts(), sent, "{}: every attempt counted, nothing else", c.name);
    }
}

#[test]
fn the_chooser_sees_the_ready_routes_and_what_was_tried_and_finding_none_gives_up() {
    let t0 = Instant::now();
    let mut m = machine(ABC, t0, vec![Ev::Fail(0, code(500)), Ev::Fail(1, CONNECT())]);
    let mut seen = None;
    let step = m.next(t0, &[up(), up(), up()], |ready, tried| {
        seen = Some((ready.clone(), ready.iter().map(|&i| tried(i)).collect::<Vec<_>>()));
        None
    });
    assert_eq!(step, Step::GiveUp, "nothing to choose (a split narrowed to no route): give up");
    assert_eq!(seen, Some((vec![0, 2], vec![true, false])), "b is left out; a was tried, c not");
}

/// A script of outcomes, then what the client gets.
struct Verdict {
    name: &'static str,
    clusters: &'static [&'static str],
    script: Vec<Ev>,
    /// The routes' health at the end (default: every route up and cool).
    views: fn(Instant) -> Vec<RouteView>,
    /// Status, error code, `Retry-After`, a part of the message.
    gives: (u16, &'static str, Option<u64>, &'static str),
    /// Some attempt was sent.
    attempted: bool,
}

fn verdict(name: &'static str, clusters: &'static [&'static str], script: Vec<Ev>) -> Verdict {
    let attempted = script.iter().any(|e| matches!(e, Ev::Fail(..) | Ev::Prefill(..) | Ev::Answered));
    Verdict { name, clusters, script, views: |_| vec![up(); 3], gives: (0, "", None, ""), attempted }
}

impl Verdict {
    fn views(self, views: fn(Instant) -> Vec<RouteView>) -> Self {
        Verdict { views, ..self }
    }
    fn gives(self, status: u16, code: &'static str, retry_after: Option<u64>, says: &'static str) -> Self {
        Verdict { gives: (status, code, retry_after, says), ..self }
    }
}

const UNAVAILABLE: &str = "no_healthy_cluster";
const LIMITED: &str = "rate_limit_exceeded";

/// Misconfigured entry points and 429s.
fn verdicts_misconfigured_or_limited() -> Vec<Verdict> {
    use ConfigReason::*;
    use Ev::*;
    let (a, b) = (Fail(0, code(404)), Fail(1, code(401)));
    let limited_twice = vec![Fail(0, busy(Some(30_000))), Fail(1, busy(Some(10_000)))];
    vec![
        verdict("every entry point misconfigured: 502 naming each, no Retry-After", AB, vec![a, b])
            .views(|_| vec![faulty(UpstreamNotFound), faulty(UpstreamUnauthorized)])
            .gives(502, "upstream_misconfigured", None, "(a: UpstreamNotFound, b: UpstreamUnauthorized)"),
        verdict("misconfigured before this request: 502, nothing attempted", A, vec![])
            .views(|_| vec![faulty(UpstreamTls)])
            .gives(502, "upstream_misconfigured", None, "a: UpstreamTls"),
        verdict(
            "one entry point misconfigured, the other failed: 503",
            AB,
            vec![Fail(0, code(404)), Fail(1, CONNECT())],
        )
        .views(|_| vec![faulty(UpstreamNotFound), up()])
        .gives(
            503,
            UNAVAILABLE,
            Some(1),
            "every allowed cluster of `served` failed; last: connect failed: refused",
        ),
        verdict("rate limited last: 429 with the longest Retry-After given", AB, limited_twice).gives(
            429,
            LIMITED,
            Some(30),
            "every cluster allowed to serve `asked` is rate limiting",
        ),
        verdict("rate limited last, open routes cooling longer: the longest left", AB, vec![Fail(0, busy(Some(2000)))])
            .views(|t0| vec![cooling(t0 + ms_(2000)), cooling(t0 + ms_(40_000))])
            .gives(429, LIMITED, Some(40), "`asked`"),
        verdict("429 without Retry-After counts as 1 s", A, vec![Fail(0, busy(None))]).gives(
            429,
            LIMITED,
            Some(1),
            "`asked`",
        ),
        verdict("Retry-After rounded up", A, vec![Fail(0, busy(Some(2500)))]).gives(429, LIMITED, Some(3), "`asked`"),
        verdict("Retry-After capped at --retry-after-cap-s", A, vec![Fail(0, busy(Some(500_000)))]).gives(
            429,
            LIMITED,
            Some(120),
            "`asked`",
        ),
        verdict("a 429, then another failure last: not a 429", AB, vec![Fail(0, busy(Some(1000))), Fail(1, CONNECT())])
            .gives(502, "upstream_failed", None, "connect failed"),
        verdict("nothing attempted, every open route cooling: 429, the longest wait", AB, vec![])
            .views(|t0| vec![down(), cooling(t0 + ms_(20_000))])
            .gives(429, LIMITED, Some(20), "`asked`"),
    ]
}

/// Open circuits and failed attempts.
fn verdicts_unavailable_or_failed() -> Vec<Verdict> {
    use Ev::*;
    let unusable = |i| Skipped(i, Skip::Unusable);
    let timed_out = vec![Fail(0, code(500)), Fail(1, CONNECT()), Fail(2, TIMEOUT())];
    let failed = vec![Fail(0, code(500)), Fail(1, CONNECT()), Fail(2, code(503))];
    let open_or_cooling = "every allowed cluster of `served` has an open circuit or is cooling down";
    vec![
        verdict("nothing attempted, every circuit open: 503", AB, vec![]).views(|_| vec![down(), down()]).gives(
            503,
            UNAVAILABLE,
            Some(1),
            open_or_cooling,
        ),
        verdict("nothing attempted, a route open but not chosen: 503", A, vec![]).gives(
            503,
            UNAVAILABLE,
            Some(1),
            open_or_cooling,
        ),
        verdict("no route can take the continuation: 503, nothing attempted", AB, vec![unusable(0), unusable(1)])
            .gives(503, UNAVAILABLE, Some(1), open_or_cooling),
        verdict("every cluster failed: 503 with the last failure", AB, vec![Fail(0, CONNECT()), Fail(1, RESET())])
            .gives(503, UNAVAILABLE, Some(1), "of `served` failed; last: connection closed early: closed"),
        verdict("the rest behind open circuits: every cluster failed, 503", AB, vec![Fail(0, CONNECT())])
            .views(|_| vec![up(), down()])
            .gives(503, UNAVAILABLE, Some(1), "failed; last: connect failed"),
        verdict("budget spent on a timeout, a cluster still open: 504", ABC, timed_out).gives(
            504,
            "upstream_timeout",
            None,
            "upstream timeout serving `asked`: no first token in time",
        ),
        verdict("budget spent, a cluster still open: 502 with the last failure", ABC, failed).gives(
            502,
            "upstream_failed",
            None,
            "serving `asked`: upstream answered 503 Service Unavailable",
        ),
        verdict("a refused prefill last, the cluster still open: 502", A, vec![Prefill(0, code(422))]).gives(
            502,
            "upstream_failed",
            None,
            "upstream answered 422",
        ),
    ]
}

fn retry_after(e: &GatewayError) -> Option<u64> {
    match e {
        GatewayError::RateLimited { retry_after, .. } | GatewayError::NoHealthyCluster { retry_after, .. } => {
            Some(*retry_after)
        }
        _ => None,
    }
}

#[test]
fn giving_up_answers_the_client_by_what_happened_last() {
    for c in verdicts_misconfigured_or_limited().into_iter().chain(verdicts_unavailable_or_failed()) {
        let t0 = Instant::now();
        let m = machine(c.clusters, t0, c.script);
        let mut views = (c.views)(t0);
        views.truncate(c.clusters.len());
        let GaveUp { error, attempted } = m.verdict(t0, &views);
        let (status, code, retry, says) = c.gives;
        assert_eq!(error.status().as_u16(), status, "{}: {error}", c.name);
        assert_eq!(error.kind().1, code, "{}", c.name);
        assert_eq!(retry_after(&error), retry, "{}", c.name);
        assert!(error.to_string().contains(says), "{}: {error}", c.name);
        assert_eq!(attempted, c.attempted, "{}", c.name);
    }
}

#[test]
fn a_model_without_a_route_within_its_policy_gives_up_before_any_attempt() {
    let cfg = GatewayConfig::with_table("t.yaml");
    let backoff: fn(u32) -> Duration = |_| Duration::ZERO;
    let Err(GaveUp { error, attempted }) = Attempts::new(&cfg, ("asked", "served"), vec![], Instant::now(), backoff)
    else {
        panic!("no route: no machine");
    };
    assert_eq!((error.status().as_u16(), error.kind().1, attempted), (503, "no_healthy_cluster", false));
    assert!(error.to_string().contains("no ready cluster of `served` is within its policy"), "{error}");
}

#[test]
fn context_length_errors_are_recognised_in_either_wording() {
    assert!(is_context_length(CONTEXT.as_bytes()));
    assert!(is_context_length(br#"{"error":{"code":"CONTEXT_LENGTH_EXCEEDED"}}"#));
    assert!(!is_context_length(br#"{"error":{"message":"messages must not be empty"}}"#));
}

#[test]
fn a_stream_that_ended_is_continued_only_when_it_broke_and_can_be() {
    use AbandonReason::*;
    use AfterStream::*;
    use StreamEnd::*;
    // The case, then how the stream ended, whether its text was kept, whether it can be
    // continued, continuations so far (of at most 2), and the decision.
    let cases = [
        ("complete: ends", complete, true, true, 0, End),
        ("finalised (no [DONE] upstream): ends", finalised, true, true, 0, End),
        ("the engine's own error event: ends", upstream_error, true, true, 0, End),
        ("the client went away: ends", client_gone, true, true, 0, End),
        (
            "a continuation that diverged: abandoned",
            StreamEnd::diverged,
            true,
            true,
            0,
            Abandon(AbandonReason::diverged),
        ),
        ("cut, no text kept (continuation off, a `none` route): ends", cut, false, true, 0, End),
        ("cut, not resumable (tool calls, several choices): abandoned", cut, true, false, 0, Abandon(unsupported)),
        ("cut, not resumable and no continuation left: unsupported first", cut, true, false, 2, Abandon(unsupported)),
        ("cut, every continuation spent: abandoned", cut, true, true, 2, Abandon(limit)),
        ("cut: continued elsewhere", cut, true, true, 0, Continue),
        ("stalled: continued elsewhere", stalled, true, true, 1, Continue),
        ("malformed: continued elsewhere", malformed, true, true, 0, Continue),
        ("truncated: continued elsewhere", truncated, true, true, 0, Continue),
        ("an oversized event: continued elsewhere", oversized, true, true, 0, Continue),
    ];
    for (name, end, recorded, resumable, continued, want) in cases {
        assert_eq!(after_stream(end, recorded, resumable, continued, 2), want, "{name}");
    }
    assert_eq!(after_stream(cut, true, true, 0, 0), Abandon(limit), "--max-continuations 0: never continued");
}
