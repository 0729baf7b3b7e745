//! The `flotilla-stage` binary as a Job runs it: progress as JSON lines on stdout with the result
//! last, the result in `<dest>/.flotilla/result.json` and in the termination-message file, and
//! the reason's exit code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{StageEvent, StageReason, StageResult};

async fn stage_bin(args: &[&str], envs: &[(&str, &str)]) -> (i32, Vec<StageEvent>) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla-stage"));
    cmd.args(args)
        .env_remove("HF_TOKEN")
        .env_remove("FLOTILLA_STAGE_TOKEN")
        .env("FLOTILLA_STAGE_RETRY_BACKOFF_MS", "10");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let events = stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    (out.status.code().unwrap(), events)
}

#[tokio::test]
async fn the_binary_reports_ready_on_stdout_in_the_result_file_and_the_termination_message() {
    let mut s = state(&[("config.json", b"{}"), ("model.safetensors", &[7u8; 5000])]);
    s.token = Some("hf_tok".into());
    let (endpoint, _) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("model");
    let term = dir.path().join("termination-log");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "hf_tok\n").unwrap();
    let (code, events) = stage_bin(
        &[
            "--source",
            &format!("hf://{REPO}"),
            "--dest",
            dest.to_str().unwrap(),
            "--termination-log",
            term.to_str().unwrap(),
        ],
        &[("HF_ENDPOINT", &endpoint), ("FLOTILLA_STAGE_TOKEN_FILE", token_file.to_str().unwrap())],
    )
    .await;
    assert_eq!(code, 0, "{events:?}");
    let phases: Vec<CachePhase> = events
        .iter()
        .map(|e| match e {
            StageEvent::Progress(p) => p.phase,
            StageEvent::Result(r) => r.phase,
        })
        .collect();
    assert_eq!(phases.first(), Some(&CachePhase::Downloading));
    assert!(phases.contains(&CachePhase::Verifying));
    let Some(StageEvent::Result(last)) = events.last() else { panic!("the last line is the result: {events:?}") };
    assert_eq!(last.phase, CachePhase::Ready);
    let from_file: StageResult =
        serde_json::from_slice(&std::fs::read(dest.join(".flotilla/result.json")).unwrap()).unwrap();
    let from_term: StageResult = serde_json::from_slice(&std::fs::read(&term).unwrap()).unwrap();
    assert_eq!(&from_file, last);
    assert_eq!(&from_term, last);
}

#[tokio::test]
async fn the_binary_exits_with_the_reasons_code() {
    let mut s = state(&[("config.json", b"{}")]);
    s.token = Some("hf_tok".into());
    let (endpoint, _) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().to_str().unwrap();
    let (code, events) = stage_bin(
        &["--source", &format!("hf://{REPO}"), "--dest", dest, "--token", "wrong"],
        &[("HF_ENDPOINT", &endpoint)],
    )
    .await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code());
    assert!(matches!(events.last(), Some(StageEvent::Result(r)) if r.reason == Some(StageReason::SourceUnauthorized)));
    assert_not_ready(dir.path());

    // An unreadable token file is a credentials problem, and it clears an earlier Ready verdict.
    let ok = stage_bin(
        &["--source", &format!("hf://{REPO}"), "--dest", dest, "--token", "hf_tok"],
        &[("HF_ENDPOINT", &endpoint)],
    )
    .await;
    assert_eq!(ok.0, 0);
    assert!(dir.path().join(".flotilla/manifest.json").exists());
    let missing = dir.path().join("no-such-token");
    let (code, _) = stage_bin(
        &["--source", &format!("hf://{REPO}"), "--dest", dest, "--token-file", missing.to_str().unwrap()],
        &[("HF_ENDPOINT", &endpoint)],
    )
    .await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code());
    assert!(assert_not_ready(dir.path()).message.contains("token file"));

    let (code, _) = stage_bin(&["--source", "ftp://x", "--dest", dest], &[]).await;
    assert_eq!(code, StageReason::InvalidSource.exit_code());
    let (code, _) = stage_bin(&["--source", "hf://a/b", "--dest", dest, "--expected-digest", "md5:1"], &[]).await;
    assert_eq!(code, 2, "usage error");
}
