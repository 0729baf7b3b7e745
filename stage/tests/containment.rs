//! What the staging program must never do to hosts and files it was not pointed at: send the
//! source's token to a host other than the configured endpoint (here: a listing page link to a
//! second loopback server, and a request built for another origin), or write or trust anything
//! through a symbolic link planted inside the destination.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use flotilla_apis::cache::CachePhase;
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

/// Files outside the destination before a run: path and bytes.
type Outside = &'static [(&'static str, &'static [u8])];

/// Every file under `dir` (not following links) with its text.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            for (k, v) in snapshot(&path) {
                out.insert(format!("{name}/{k}"), v);
            }
        } else {
            out.insert(name, String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned());
        }
    }
    out
}

#[tokio::test]
async fn a_symlink_planted_in_the_destination_is_never_written_through_or_trusted() {
    let (endpoint, _) = start(small()).await;
    // (link inside dest, target outside, what the outside holds before the run)
    let cases: [(&str, &str, Outside); 4] = [
        // a directory component: on main the file was renamed into the outside directory
        ("sub", "dir", &[("dir/tokenizer.json", b"outside, keep me")]),
        // a partial file shorter than the source's: on main the rest was appended to the outside file
        (".flotilla/partial/config.json", "victim", &[("victim", b"{")]),
        // a final file with the source's bytes: on main it was hashed through the link and reported Ready
        ("config.json", "config.json", &[("config.json", CONFIG)]),
        // the state directory itself: on main the result and manifest were written outside
        (".flotilla", "state", &[("state/result.json", b"outside, keep me")]),
    ];
    for (link, target, outside_files) in cases {
        let root = tempfile::tempdir().unwrap();
        let (dest, outside) = (root.path().join("dest"), root.path().join("outside"));
        for (p, b) in outside_files {
            let path = outside.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b).unwrap();
        }
        let link_path = dest.join(link);
        std::fs::create_dir_all(link_path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.join(target), &link_path).unwrap();
        let before = snapshot(&outside);

        let opts = options(&format!("hf://{REPO}"), &endpoint, &dest);
        let result = flotilla_stage::run(&opts, &mut |_| {}).await;
        let written = flotilla_stage::write_result(&dest, &result).await;

        assert_eq!(snapshot(&outside), before, "{link}: nothing outside the destination changes");
        assert_eq!(result.phase, CachePhase::Failed, "{link}: {result:?}");
        assert_eq!(result.reason, Some(StageReason::StorageUnavailable), "{link}: {result:?}");
        let named = link_path.display().to_string();
        assert!(
            result.message.contains(&named) && result.message.contains("symbolic link"),
            "{link}: the message names the link: {}",
            result.message
        );
        if link == ".flotilla" {
            assert!(written.is_err(), "the result is not written through the link either");
        } else {
            written.unwrap();
            assert_not_ready(&dest);
        }
    }
}
