//! What the staging program must never do to hosts it was not pointed at: send the source's
//! token to a host other than the configured endpoint (here: a listing page link to a second
//! loopback server, and a request built for another origin).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::*;
use flotilla_apis::stage::StageReason;
use flotilla_stage::http::{Http, Req};

const TOKEN: &str = "hf_secret";
const CONFIG: &[u8] = b"{\"hidden_size\": 8, \"layers\": 2}";

fn small() -> State {
    state(&[("config.json", CONFIG), ("sub/tokenizer.json", b"{\"vocab\":{}}")])
}

#[tokio::test]
async fn a_next_page_link_to_another_host_is_refused_and_never_gets_the_token() {
    let (foreign, foreign_state) = start(small()).await;
    let mut s = small();
    s.token = Some(TOKEN.into());
    s.page_size = 1;
    s.next_page_base = Some(foreign.clone()); // same 127.0.0.1, another port: another origin
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    opts.config.token = Some(TOKEN.into());
    let result = run(&opts).await;

    let seen = foreign_state.lock().unwrap().seen.clone();
    assert!(seen.iter().all(|(_, auth)| auth.is_none()), "the other host received the token: {seen:?}");
    assert!(seen.is_empty(), "a next link to another origin is not followed at all: {seen:?}");
    assert_eq!(result.reason, Some(StageReason::InvalidSource), "{result:?}");
    assert!(result.message.contains(&foreign) && result.message.contains(&endpoint), "{}", result.message);
    assert_not_ready(dir.path());
    let home = shared.lock().unwrap().seen.clone();
    assert!(
        home.iter().any(|(p, a)| p.contains("/tree/") && a.as_deref() == Some("Bearer hf_secret")),
        "the endpoint itself did get the token: {home:?}"
    );
}

#[tokio::test]
async fn credentials_are_stripped_from_a_request_to_another_origin() {
    let (home, _) = start(small()).await;
    let (foreign, foreign_state) = start(small()).await;
    let policy = options("hf://a/b", &home, Path::new("/nonexistent")).policy;
    let http = Http::new(policy).unwrap();
    // Built for the home endpoint's origin, sent to another: the header must not travel.
    let req =
        Req::get(&format!("{foreign}/api/models/x")).unwrap().credential(&home, &format!("Bearer {TOKEN}")).unwrap();
    let response = http.send(&req).await.unwrap();
    assert_eq!(response.status(), 401, "the fake hub answers an unknown repository with 401");
    let same = Req::get(&format!("{home}/api/models/x")).unwrap().credential(&home, "Bearer t").unwrap();
    http.send(&same).await.unwrap();
    let seen = foreign_state.lock().unwrap().seen.clone();
    assert_eq!(seen, vec![("/api/models/x".to_string(), None)]);
}
