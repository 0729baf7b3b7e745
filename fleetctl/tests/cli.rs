//! The command line itself: every offline example in `--help` runs and succeeds (the live ones
//! run in `e2e_cli.rs`), and a control cluster that cannot be reached or configured exits 3 —
//! while invalid files still exit 1 before any cluster is contacted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .current_dir(repo())
        .env_remove("KUBECONFIG")
        .env_remove("FLEETCTL_FILES")
        .output()
        .expect("run fleetctl")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn examples(subcommand: &str) -> Vec<String> {
    let help = String::from_utf8(fleetctl(&[subcommand, "--help"]).stdout).unwrap();
    let (_, after) = help.split_once("Examples:").unwrap_or_else(|| panic!("{subcommand} --help has no examples"));
    after.lines().map(str::trim).filter(|l| l.starts_with("fleetctl ")).map(str::to_string).collect()
}

#[test]
fn offline_help_examples_run() {
    let mut ran = 0;
    for sub in ["validate", "plan", "explain", "get", "crds", "completion"] {
        let all = examples(sub);
        assert!(!all.is_empty(), "{sub}");
        for example in all {
            // Live examples need a control cluster (e2e_cli.rs); pipes, redirects and --write
            // need a shell or would rewrite committed files.
            let live = example.contains("--live") || example.starts_with("fleetctl get");
            if live || example.contains('|') || example.contains('>') || example.contains("--write") {
                continue;
            }
            let args: Vec<&str> = example.split_whitespace().skip(1).collect();
            let out = fleetctl(&args);
            // 2 is a plan with replicas unplaced: the example fleet's search team is over its
            // FleetQuota on purpose (examples/fleet/quotas.yaml).
            let unplaced = matches!(sub, "plan" | "explain") && out.status.code() == Some(2);
            assert!(out.status.code() == Some(0) || unplaced, "{example}: {:?}\n{}", out.status.code(), stderr(&out));
            assert!(!out.stdout.is_empty(), "{example} printed nothing");
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} examples ran");
}

#[test]
fn completion_scripts_name_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = fleetctl(&["completion", shell]);
        assert_eq!(out.status.code(), Some(0));
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["plan", "explain", "get", "validate", "completion", "kubeconfig", "live", "deployments"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
}

fn unreachable_kubeconfig() -> PathBuf {
    // A loopback port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let path = std::env::temp_dir().join(format!("fleetctl-unreachable-{}.kubeconfig", std::process::id()));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u, namespace: ml}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn an_unreachable_control_cluster_exits_3() {
    let kc = unreachable_kubeconfig();
    let kc = kc.to_str().unwrap();
    for args in [
        vec!["get", "deployments", "--kubeconfig", kc],
        vec!["get", "clusters", "-o", "json", "--kubeconfig", kc],
        vec!["plan", "-f", "examples/fleet", "--live", "--kubeconfig", kc],
        vec!["explain", "--live", "md/x", "--kubeconfig", kc],
    ] {
        let out = fleetctl(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("cannot reach the control cluster at https://127.0.0.1:"), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "nothing on stdout: {args:?}");
    }
    // Invalid files are refused first: exit 1, and no cluster is contacted.
    let out =
        fleetctl(&["plan", "-f", "tests/fixtures/invalid/05-negative-replicas.yaml", "--live", "--kubeconfig", kc]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("cannot reach"), "{}", stderr(&out));
}

#[test]
fn a_missing_kubeconfig_or_context_exits_3() {
    let out = fleetctl(&["get", "md", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot read the kubeconfig /nonexistent/kubeconfig"), "{}", stderr(&out));
    let kc = unreachable_kubeconfig();
    let out = fleetctl(&["get", "md", "--kubeconfig", kc.to_str().unwrap(), "--context", "nope"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("nope"), "{}", stderr(&out));
}

#[test]
fn a_usage_error_has_its_own_exit_code_and_help_succeeds() {
    // 2 means "replicas unplaced" for `plan`: a typo must not look like that to CI.
    for args in [&["plna", "-f", "examples/fleet"][..], &["plan", "--no-such-flag"], &["validate"]] {
        let out = fleetctl(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("Usage"), "{args:?}: {}", stderr(&out));
    }
    for args in [&["--help"][..], &["plan", "--help"], &["--version"]] {
        let out = fleetctl(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
}

fn fleetctl_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .current_dir(repo())
        .env_remove("KUBECONFIG")
        .env_remove("FLEETCTL_FILES")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run fleetctl");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn dash_f_dash_reads_standard_input() {
    // The example fleet piped in, as `helm template ... | fleetctl validate -f -` would.
    let mut all = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut stack = vec![repo().join("examples/fleet")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|e| e == "yaml") {
            files.push(p);
        }
    }
    files.sort();
    for f in &files {
        all.extend_from_slice(b"---\n");
        all.extend(std::fs::read(f).unwrap());
        all.push(b'\n');
    }
    let piped = fleetctl_stdin(&["plan", "-f", "-"], &all);
    let direct = fleetctl(&["plan", "-f", "examples/fleet"]);
    assert_eq!(piped.status.code(), direct.status.code(), "{}", stderr(&piped));
    assert_eq!(String::from_utf8_lossy(&piped.stdout), String::from_utf8_lossy(&direct.stdout), "the same plan");
    // An error names `<stdin>` and the line.
    let out = fleetctl_stdin(
        &["validate", "-f", "-"],
        b"apiVersion: flotilla.dev/v1alpha1\nkind: InferenceClass\nmetadata: {name: x}\nspec: {devicesPerNode: nope}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert!(text.contains("<stdin>:"), "{text}");
    // Read once only.
    let out = fleetctl_stdin(&["validate", "-f", "-", "-f", "-"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("standard input can be read once"), "{}", stderr(&out));
}
