//! The identities the e2e controller runs with, so that every e2e test proves the controller
//! works with the rights users give it and no more. On the control cluster: the chart's own
//! controller RBAC (ServiceAccount, ClusterRole, Roles, bindings), rendered by the built helm
//! (`tests/helm/build-helm.sh`) with `helm template --show-only` into release namespace
//! `flotilla` with member kubeconfig Secrets in `flotilla-system` (the chart's recommended
//! layout: kubeconfigs in a namespace of their own, not beside Helm's release Secrets), applied,
//! and a TokenRequest token for `flotilla/flotilla-controller`. On each member:
//! `examples/member-rbac/flotilla-member.yaml` applied as documented and a token for
//! `flotilla-system/flotilla-member`, whose kubeconfig is what the tests put into the member
//! kubeconfig Secrets. Each kubeconfig is written once per fleet (`tests/e2e/harness/identity.sh`)
//! and reused. `assert_least_rights` asks the API servers, through those tokens, what each
//! identity may do (SelfSubjectAccessReview). No e2e test runs the controller as admin. The
//! tests' own setup and checks keep the admin kubeconfigs. fleetctl's harness includes this file
//! by path (`fleetctl/tests/harness/mod.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;

use super::{Fleet, client_of, repo};

/// The release namespace the chart is rendered into; the e2e controller's Lease lives there
/// (`--lease-namespace`).
pub const RELEASE_NAMESPACE: &str = "flotilla";
/// The namespace of `examples/member-rbac/flotilla-member.yaml`'s ServiceAccount on members.
pub const MEMBER_SA_NAMESPACE: &str = "flotilla-system";
/// The chart's controller ServiceAccount (release `flotilla`).
pub const CONTROLLER_SA: &str = "flotilla-controller";
/// The member identity of `examples/member-rbac/flotilla-member.yaml`.
pub const MEMBER_SA: &str = "flotilla-member";
/// Where the e2e tests keep member kubeconfig Secrets: the chart is rendered with
/// `controller.memberSecrets.namespaces` set to it (`--member-secret-namespace`).
pub const MEMBER_SECRET_NAMESPACE: &str = "flotilla-system";
/// The tenant namespace `examples/member-rbac/flotilla-member.yaml` binds on each member.
pub const TENANT_NAMESPACE: &str = "ml";

/// The `--set` values every e2e render of the chart uses.
pub const CHART_VALUES: &[&str] = &["controller.memberSecrets.namespaces={flotilla-system}"];

/// The helm binary `tests/helm/build-helm.sh` builds once and caches.
fn helm() -> &'static PathBuf {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash").arg(repo().join("tests/helm/build-helm.sh")).output().unwrap();
        assert!(out.status.success(), "tests/helm/build-helm.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// The chart's controller RBAC and ServiceAccount, rendered with `CHART_VALUES` and `extra`.
pub fn chart_controller_rbac(extra: &[&str]) -> String {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "flotilla"])
        .arg(repo().join("charts/flotilla"))
        .args(["--namespace", RELEASE_NAMESPACE])
        .args([
            "--show-only",
            "templates/controller/rbac.yaml",
            "--show-only",
            "templates/controller/serviceaccount.yaml",
        ]);
    for v in CHART_VALUES.iter().chain(extra) {
        cmd.args(["--set", v]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "helm template failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

impl Fleet {
    /// A kubeconfig for the chart's controller ServiceAccount on cluster `control`, the chart's
    /// RBAC applied first (rendered with `CHART_VALUES` and `values`). Written once per fleet.
    pub fn controller_kubeconfig(&self, control: &str, values: &[&str]) -> PathBuf {
        let out = self.dir.join(format!("{control}.{CONTROLLER_SA}.kubeconfig"));
        if !out.exists() {
            let manifest = self.dir.join(format!("{control}.controller-rbac.yaml"));
            std::fs::write(&manifest, chart_controller_rbac(values)).unwrap();
            self.identity(control, &manifest, RELEASE_NAMESPACE, CONTROLLER_SA, &out);
        }
        out
    }

    /// The text of a kubeconfig for the member-rbac identity on `member`, after applying
    /// `examples/member-rbac/flotilla-member.yaml` there (which creates the tenant namespace
    /// `ml` and binds the workload verbs in it). Put this, not the admin `kubeconfig_text`, into
    /// member kubeconfig Secrets. Written once per fleet.
    pub fn member_kubeconfig_text(&self, member: &str) -> String {
        let out = self.dir.join(format!("{member}.{MEMBER_SA}.kubeconfig"));
        if !out.exists() {
            let manifest = repo().join("examples/member-rbac/flotilla-member.yaml");
            self.identity(member, &manifest, MEMBER_SA_NAMESPACE, MEMBER_SA, &out);
        }
        std::fs::read_to_string(out).unwrap()
    }

    /// Applies one more manifest of `examples/member-rbac/` (e.g. `sim-cloud.yaml`, which a
    /// controller started with `--sim-cloud` needs) to `member`, for its member-rbac identity.
    pub fn grant_member(&self, member: &str, example: &str) {
        let admin = self.kubeconfig(member);
        let manifest = repo().join("examples/member-rbac").join(example);
        self.run("identity.sh", &[admin.to_str().unwrap(), manifest.to_str().unwrap()]);
    }

    /// Applies a manifest file to `cluster` as its admin (`kubectl apply`).
    pub fn apply_file(&self, cluster: &str, manifest: &std::path::Path) {
        let admin = self.kubeconfig(cluster);
        self.run("identity.sh", &[admin.to_str().unwrap(), manifest.to_str().unwrap()]);
    }

    /// A kubeconfig for ServiceAccount `ns/sa` on `cluster` after applying `manifest` there
    /// (its RBAC). Written once per fleet.
    pub fn identity_kubeconfig(&self, cluster: &str, manifest: &std::path::Path, ns: &str, sa: &str) -> PathBuf {
        let out = self.dir.join(format!("{cluster}.{ns}.{sa}.kubeconfig"));
        if !out.exists() {
            self.identity(cluster, manifest, ns, sa, &out);
        }
        out
    }

    fn identity(&self, cluster: &str, manifest: &std::path::Path, ns: &str, sa: &str, out: &std::path::Path) {
        let admin = self.kubeconfig(cluster);
        self.run("identity.sh", &[admin.to_str().unwrap(), manifest.to_str().unwrap(), ns, sa, out.to_str().unwrap()]);
    }

    /// A client of the member-rbac identity on `member` (`member_kubeconfig_text`).
    pub async fn member_identity_client(&self, member: &str) -> Client {
        let kc = Kubeconfig::from_yaml(&self.member_kubeconfig_text(member)).unwrap();
        client_of(kc).await
    }

    /// A client of the chart's controller identity on `control` (`controller_kubeconfig`).
    pub async fn controller_identity_client(&self, control: &str) -> Client {
        let kc = Kubeconfig::read_from(self.controller_kubeconfig(control, &[])).unwrap();
        client_of(kc).await
    }
}

/// One question to the API server: may the client's own identity do `verb` on `resource`
/// (`group/resource` or `resource` for the core group) in `namespace` (`""`: cluster-wide),
/// optionally on the object `name`?
pub async fn can(client: &Client, verb: &str, resource: &str, namespace: &str, name: &str) -> bool {
    // `resource`, `group/resource` or `group/resource/subresource` (the core group empty).
    let parts: Vec<&str> = resource.split('/').collect();
    let (group, resource, subresource) = match parts[..] {
        [r] => ("", r, None),
        [g, r] => (g, r, None),
        [g, r, sub, ..] => (g, r, Some(sub)),
        [] => ("", "", None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource: subresource.map(Into::into),
                namespace: (!namespace.is_empty()).then(|| namespace.into()),
                name: (!name.is_empty()).then(|| name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectAccessReview {verb} {resource} in {namespace:?}: {e}"));
    answer.status.is_some_and(|s| s.allowed)
}

/// `(verb, resource, namespace, name, allowed)`: what an identity must and must not be allowed.
pub type Expectation<'a> = (&'a str, &'a str, &'a str, &'a str, bool);

/// Asks the API server each question of `expect` through `client` and fails naming every
/// answer that differs.
pub async fn assert_rights(who: &str, client: &Client, expect: &[Expectation<'_>]) {
    let mut wrong = Vec::new();
    for &(verb, resource, ns, name, want) in expect {
        let got = can(client, verb, resource, ns, name).await;
        if got != want {
            wrong.push(format!("{verb} {resource} ns={ns:?} name={name:?}: allowed={got}, want {want}"));
        }
    }
    assert!(wrong.is_empty(), "{who} has other rights than it should:\n  {}", wrong.join("\n  "));
}

/// The rights of the two e2e identities, asked through their own tokens: what the controller's
/// code uses is allowed, and the nearest things beyond it are refused. On `control`, the chart's
/// controller ServiceAccount reads Secrets only in the member-kubeconfig namespace and writes no
/// Secret, no spec and no other Lease; on `member`, the member-rbac identity writes workloads and
/// staging objects only in the tenant namespace, reads no Secret elsewhere and creates no
/// namespace.
pub async fn assert_least_rights(fleet: &Fleet, control: &str, member: &str) {
    let ctl = fleet.controller_identity_client(control).await;
    let (ks, ten) = (MEMBER_SECRET_NAMESPACE, TENANT_NAMESPACE);
    #[rustfmt::skip]
    let control_rights: &[Expectation] = &[
        ("get", "secrets", ks, "m1-kubeconfig", true),
        ("watch", "secrets", ks, "", true),
        ("list", "flotilla.dev/modeldeployments", "", "", true),
        ("patch", "flotilla.dev/modeldeployments", ten, "", true),
        ("create", "flotilla.dev/capacityclaims", ten, "", true),
        ("watch", "flotilla.dev/fleetquotas", "", "", true),
        ("patch", "flotilla.dev/fleetquotas/status", ten, "", true),
        ("create", "events.k8s.io/events", ten, "", true),
        ("get", "coordination.k8s.io/leases", RELEASE_NAMESPACE, "flotilla-controller", true),
        // Secrets anywhere else, or written.
        ("get", "secrets", ten, "", false),
        ("get", "secrets", "default", "", false),
        ("get", "secrets", "kube-system", "", false),
        ("list", "secrets", RELEASE_NAMESPACE, "", false), // Helm's release Secrets
        ("list", "secrets", "", "", false),
        ("create", "secrets", ks, "", false),
        ("patch", "secrets", ks, "m1-kubeconfig", false),
        ("delete", "secrets", ks, "m1-kubeconfig", false),
        // Specs the user writes, other kinds, other Leases, RBAC.
        ("update", "flotilla.dev/modeldeployments", ten, "", false),
        ("create", "flotilla.dev/modeldeployments", ten, "", false),
        ("delete", "flotilla.dev/inferenceclusters", "", "", false),
        ("patch", "flotilla.dev/inferenceclasses", "", "", false),
        // A quota is the platform team's: the controller writes its status, never its spec.
        ("patch", "flotilla.dev/fleetquotas", ten, "", false),
        ("create", "flotilla.dev/fleetquotas", ten, "", false),
        ("create", "pods", ten, "", false),
        ("create", "events", ten, "", false),
        ("get", "coordination.k8s.io/leases", RELEASE_NAMESPACE, "flotilla-gateway", false),
        ("create", "rbac.authorization.k8s.io/rolebindings", ks, "", false),
        ("create", "/serviceaccounts/token", RELEASE_NAMESPACE, CONTROLLER_SA, false),
    ];
    assert_rights(&format!("the controller identity on {control}"), &ctl, control_rights).await;

    let m = fleet.member_identity_client(member).await;
    #[rustfmt::skip]
    let member_rights: &[Expectation] = &[
        ("list", "nodes", "", "", true),
        ("watch", "pods", "", "", true),
        ("patch", "nodes", "", "", true),
        ("list", "resource.k8s.io/resourceslices", "", "", true),
        ("create", "apps/deployments", ten, "", true),
        ("delete", "services", ten, "", true),
        ("patch", "policy/poddisruptionbudgets", ten, "", true),
        // ModelCache staging (controllers/src/cache/members.rs, member/staging.rs, sweep.rs).
        ("create", "batch/jobs", ten, "", true),
        ("delete", "batch/jobs", ten, "", true),
        ("watch", "batch/jobs", ten, "", true),
        ("get", "persistentvolumeclaims", ten, "", true),
        ("patch", "persistentvolumeclaims", ten, "", true),
        ("watch", "persistentvolumeclaims", ten, "", true),
        ("list", "secrets", ten, "", true),
        ("watch", "secrets", ten, "", true),
        ("patch", "secrets", ten, "", true),
        // Outside the tenant namespace, and what the controller never does.
        ("create", "apps/deployments", "default", "", false),
        ("create", "apps/deployments", "kube-system", "", false),
        ("create", "batch/jobs", "default", "", false),
        ("create", "persistentvolumeclaims", "kube-system", "", false),
        ("get", "secrets", "kube-system", "", false),
        ("get", "secrets", MEMBER_SA_NAMESPACE, "", false),
        ("list", "secrets", "", "", false),
        ("get", "secrets", ten, "", false),
        ("watch", "batch/jobs", "default", "", false),
        ("watch", "secrets", "default", "", false),
        ("create", "namespaces", "", "", false),
        ("delete", "nodes", "", "", false),
        ("update", "nodes", "", "", false),
        ("create", "pods", ten, "", false),
        ("create", "rbac.authorization.k8s.io/rolebindings", ten, "", false),
    ];
    assert_rights(&format!("the member identity on {member}"), &m, member_rights).await;
}
