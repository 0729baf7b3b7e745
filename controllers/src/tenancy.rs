//! Which namespaces tenants may use. A ModelDeployment or ModelCache is rendered into the same
//! namespace of every member it reaches (and a CapacityClaim spends the operator's cloud money), so one created in `kube-system` (or in Flotilla's own
//! namespaces: the controller's and the member kubeconfigs') would run its YAML's image there: such objects are refused with `InvalidSpec`
//! before anything is solved or written, and an operator can narrow the accepted namespaces
//! further with an allow-list (`--tenant-namespaces`). Pure: [`Tenancy::check`] decides.

use std::collections::BTreeSet;

use flotilla_apis::conditions::{Desired, Status};
use flotilla_apis::constants::{PROTECTED_NAMESPACES, condition, reason};

/// The namespaces the controller accepts tenant objects in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenancy {
    /// Flotilla's own namespaces (the controller's, where its Lease is, and the member
    /// kubeconfigs'): protected like `kube-system`.
    pub own: BTreeSet<String>,
    /// When non-empty, only these namespaces are accepted (still never a protected one).
    pub allowed: BTreeSet<String>,
}

impl Tenancy {
    /// Tenancy with Flotilla's namespaces and an allow-list (empty: any unprotected namespace).
    pub fn new(own: impl IntoIterator<Item = String>, allowed: impl IntoIterator<Item = String>) -> Self {
        let nonempty = |n: &String| !n.is_empty();
        Self {
            own: own.into_iter().filter(nonempty).collect(),
            allowed: allowed.into_iter().filter(nonempty).collect(),
        }
    }

    /// Whether `namespace` is protected (never usable by a tenant).
    pub fn protected(&self, namespace: &str) -> bool {
        PROTECTED_NAMESPACES.contains(&namespace) || self.own.contains(namespace)
    }

    /// `Ok` when a `kind` in `namespace` may be reconciled; otherwise the `InvalidSpec` message,
    /// naming the namespace and what to do.
    pub fn check(&self, kind: &str, namespace: &str) -> Result<(), String> {
        if self.protected(namespace) {
            let own: Vec<&str> = self.own.iter().map(String::as_str).collect();
            return Err(format!(
                "namespace {namespace} is protected (kube-system, kube-public, kube-node-lease and Flotilla's own \
                 {}): a {kind} there is refused and nothing is written to any member; create it in a tenant namespace",
                own.join(", ")
            ));
        }
        if !self.allowed.is_empty() && !self.allowed.contains(namespace) {
            let allowed: Vec<&str> = self.allowed.iter().map(String::as_str).collect();
            return Err(format!(
                "namespace {namespace} is not a tenant namespace of this controller (--tenant-namespaces: {}): a \
                 {kind} there is refused and nothing is written to any member",
                allowed.join(", ")
            ));
        }
        Ok(())
    }
}

/// The conditions of a refused object: each named condition `False` with `InvalidSpec` and the
/// refusal message.
pub fn refused(types: &[&'static str], message: &str) -> Vec<Desired> {
    types.iter().map(|t| Desired::new(t, Status::False, reason::INVALID_SPEC, message.to_string())).collect()
}

/// The condition types a refused ModelDeployment carries.
pub const DEPLOYMENT_REFUSED: [&str; 2] = [condition::PLACED, condition::READY];
/// The condition types a refused ModelCache carries.
pub const CACHE_REFUSED: [&str; 3] = [condition::ACCEPTED, condition::STAGED, condition::READY];
/// The condition types a refused CapacityClaim carries: it asks no provider for anything.
pub const CLAIM_REFUSED: [&str; 3] = [condition::FULFILLED, condition::PROVISIONING, condition::READY];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_namespaces_are_refused_whatever_the_allow_list_says() {
        let open = Tenancy::new(["flotilla-system".to_string(), "flotilla-system-members".to_string()], []);
        for ns in ["kube-system", "kube-public", "kube-node-lease", "flotilla-system", "flotilla-system-members"] {
            let err = open.check("ModelDeployment", ns).unwrap_err();
            assert!(err.contains(&format!("namespace {ns} is protected")), "{err}");
            assert!(err.contains("nothing is written to any member"), "{err}");
        }
        let listed = Tenancy::new(["flotilla".to_string()], ["kube-system".to_string(), "ml".to_string()]);
        assert!(listed.check("ModelCache", "kube-system").is_err(), "an allow-list cannot open a protected namespace");
        assert!(listed.check("ModelCache", "flotilla").is_err(), "the controller's own namespace, whatever its name");
        assert!(listed.check("ModelCache", "flotilla-system").is_err(), "not listed");
    }

    #[test]
    fn without_an_allow_list_every_other_namespace_is_a_tenant() {
        let open = Tenancy::new(["flotilla-system".to_string()], [String::new()]);
        assert!(open.allowed.is_empty(), "an empty flag value is no allow-list");
        for ns in ["ml", "default", "team-a", "kube-systems"] {
            assert_eq!(open.check("ModelDeployment", ns), Ok(()), "{ns}");
        }
    }

    #[test]
    fn an_allow_list_narrows_to_its_namespaces() {
        let t = Tenancy::new(["flotilla-system".to_string()], ["ml".to_string(), "team-a".to_string()]);
        assert_eq!(t.check("ModelDeployment", "ml"), Ok(()));
        assert_eq!(t.check("ModelDeployment", "team-a"), Ok(()));
        let err = t.check("ModelDeployment", "default").unwrap_err();
        assert!(err.contains("--tenant-namespaces: ml, team-a"), "{err}");
    }

    #[test]
    fn a_refusal_sets_each_condition_false_with_invalid_spec() {
        let c = refused(&DEPLOYMENT_REFUSED, "why");
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|d| d.status == Status::False && d.reason == reason::INVALID_SPEC && d.message == "why"));
    }
}
