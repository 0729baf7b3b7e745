//! `flotilla-stage`: the command a ModelCache staging Job runs in each member cluster. It stages
//! `--source` into `--dest`, prints progress as JSON lines on stdout (the last line is always the
//! result), writes the result to `<dest>/.flotilla/result.json` and, when asked, to the
//! Kubernetes termination-message file, and exits with the reason's code (0 when Ready). See
//! docs/staging.md.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{StageEvent, StageReason, StageResult, is_sha256_digest};
use flotilla_stage::{Options, RetryPolicy, S3Auth, SourceConfig, run, write_result};

/// Stage model weights from hf://, s3:// or oci:// into a directory and verify them.
///
/// Examples:
///   flotilla-stage --source hf://Qwen/Qwen2.5-0.5B@main --dest /models/qwen
///   flotilla-stage --source s3://my-bucket/llama-70b --dest /models/llama --s3-region eu-central-1
///   flotilla-stage --source oci://ghcr.io/my-org/llama-weights:v1 --dest /models/llama --termination-log /dev/termination-log
#[derive(Parser, Debug)]
#[command(name = "flotilla-stage", version, verbatim_doc_comment)]
pub struct Cli {
    /// hf://org/name[@revision], s3://bucket[/prefix] or oci://registry/repo[:tag|@sha256:…].
    #[arg(long, env = "FLOTILLA_STAGE_SOURCE")]
    source: String,
    /// Directory to stage into (created if missing).
    #[arg(long, env = "FLOTILLA_STAGE_DEST")]
    dest: PathBuf,
    /// Revision for hf:// sources (a branch, tag or commit); `main` when neither this nor @rev is given.
    #[arg(long, env = "FLOTILLA_STAGE_REVISION")]
    revision: Option<String>,
    /// Manifest digest the staged set must have: sha256:<64 hex>.
    #[arg(long, env = "FLOTILLA_STAGE_EXPECTED_DIGEST", value_parser = parse_digest)]
    expected_digest: Option<String>,
    /// File holding the source token (a mounted Secret key); wins over --token.
    #[arg(long, env = "FLOTILLA_STAGE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Source token: Hugging Face bearer token, or registry token/password. HF_TOKEN also works for hf://.
    #[arg(long, env = "FLOTILLA_STAGE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Hugging Face endpoint.
    #[arg(long, env = "HF_ENDPOINT", default_value = flotilla_stage::hf::DEFAULT_ENDPOINT)]
    hf_endpoint: String,
    /// S3 endpoint (path-style addressing); AWS's when unset. AWS_ENDPOINT_URL is used when this is unset.
    #[arg(long, env = "AWS_ENDPOINT_URL_S3")]
    s3_endpoint: Option<String>,
    /// S3 region (AWS_DEFAULT_REGION, then the AWS profile and instance metadata, when unset).
    #[arg(long, env = "AWS_REGION")]
    s3_region: Option<String>,
    /// Send S3 requests unsigned (a public bucket), even where AWS credentials are available.
    /// Otherwise credentials come from the AWS SDK's chain: environment, profile, web identity
    /// (IRSA), container credentials (EKS Pod Identity), instance profile.
    #[arg(long, env = "FLOTILLA_STAGE_S3_NO_SIGN_REQUEST")]
    s3_no_sign_request: bool,
    /// Registry base URL (e.g. http://127.0.0.1:5000); https://<registry> when unset.
    #[arg(long, env = "FLOTILLA_STAGE_OCI_ENDPOINT")]
    oci_endpoint: Option<String>,
    /// Registry user name for the token flow; the token is then the password.
    #[arg(long, env = "FLOTILLA_STAGE_OCI_USERNAME")]
    oci_username: Option<String>,
    /// Retries per request on network errors, 5xx and 429 (downloads resume).
    #[arg(long, env = "FLOTILLA_STAGE_RETRIES", default_value_t = 5)]
    retries: u32,
    /// First retry backoff in milliseconds; doubles per retry, capped at 30 s.
    #[arg(long, env = "FLOTILLA_STAGE_RETRY_BACKOFF_MS", default_value_t = 1000)]
    retry_backoff_ms: u64,
    /// Seconds to wait for response headers or the next body bytes before retrying.
    #[arg(long, env = "FLOTILLA_STAGE_READ_TIMEOUT_SECS", default_value_t = 60)]
    read_timeout_secs: u64,
    /// Files downloaded at the same time.
    #[arg(long, env = "FLOTILLA_STAGE_CONCURRENCY", default_value_t = 4)]
    concurrency: usize,
    /// Seconds between progress lines while downloads run (besides one per finished file).
    #[arg(long, env = "FLOTILLA_STAGE_PROGRESS_INTERVAL_SECS", default_value_t = 10)]
    progress_interval_secs: u64,
    /// Also write the result JSON here (the Job sets /dev/termination-log).
    #[arg(long, env = "FLOTILLA_STAGE_TERMINATION_LOG")]
    termination_log: Option<PathBuf>,
}

fn parse_digest(s: &str) -> Result<String, String> {
    if is_sha256_digest(s) { Ok(s.to_string()) } else { Err("expected sha256:<64 lowercase hex>".into()) }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = runtime.block_on(stage(&cli));
    let line = result.to_line();
    if let Some(path) = &cli.termination_log
        && let Err(e) = std::fs::write(path, &line)
    {
        eprintln!("flotilla-stage: cannot write the termination message to {}: {e}", path.display());
    }
    emit(&StageEvent::Result(result.clone()));
    std::process::exit(result.reason.map_or(0, StageReason::exit_code));
}

async fn stage(cli: &Cli) -> StageResult {
    let result = match options(cli) {
        Ok(opts) => run(&opts, &mut |p| emit(&StageEvent::Progress(p))).await,
        Err((reason, message)) => failed(cli, reason, message),
    };
    // Written even for a failure found before staging began, so no earlier verdict survives.
    if let Err(e) = write_result(&cli.dest, &result).await {
        eprintln!("flotilla-stage: {e}");
        if result.reason.is_none() {
            return failed(cli, StageReason::StorageUnavailable, e.to_string());
        }
    }
    result
}

/// The run's options from flags and environment, or the result of a failure to read them.
fn options(cli: &Cli) -> Result<Options, (StageReason, String)> {
    let token = match (&cli.token_file, &cli.token) {
        (Some(path), _) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => {
                let message = format!(
                    "cannot read the token file {}: {e}; check the credentials Secret and its mount",
                    path.display()
                );
                return Err((StageReason::SourceUnauthorized, message));
            }
        },
        (None, Some(t)) => Some(t.clone()),
        (None, None) if cli.source.starts_with("hf://") => env("HF_TOKEN"),
        (None, None) => None,
    };
    let opts = Options {
        source: cli.source.clone(),
        dest: cli.dest.clone(),
        expected_digest: cli.expected_digest.clone(),
        config: SourceConfig {
            revision: cli.revision.clone(),
            token: token.filter(|t| !t.is_empty()),
            hf_endpoint: Some(cli.hf_endpoint.clone()),
            s3_endpoint: cli.s3_endpoint.clone().or_else(|| env("AWS_ENDPOINT_URL")),
            s3_region: cli.s3_region.clone().or_else(|| env("AWS_DEFAULT_REGION")),
            s3_auth: if cli.s3_no_sign_request { S3Auth::Anonymous } else { S3Auth::Chain },
            s3_page_size: None,
            oci_endpoint: cli.oci_endpoint.clone(),
            oci_username: cli.oci_username.clone(),
        },
        policy: RetryPolicy {
            retries: cli.retries,
            backoff: Duration::from_millis(cli.retry_backoff_ms),
            read_timeout: Duration::from_secs(cli.read_timeout_secs.max(1)),
        },
        concurrency: cli.concurrency,
        progress_interval: Duration::from_secs(cli.progress_interval_secs.max(1)),
    };
    Ok(opts)
}

fn failed(cli: &Cli, reason: StageReason, message: String) -> StageResult {
    StageResult {
        phase: CachePhase::Failed,
        reason: Some(reason),
        message,
        source: cli.source.clone(),
        file: None,
        digest: None,
        expected_digest: cli.expected_digest.clone(),
        resolved: None,
        files: 0,
        bytes: 0,
    }
}

fn emit(event: &StageEvent) {
    let mut out = std::io::stdout().lock();
    if let Ok(line) = serde_json::to_string(event) {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
