//! Which Secret a ModelCache's `spec.credentialsRef` may make the controller read: one in the
//! cache's own namespace, nothing else. The controller reads it with its own identity and
//! copies every key into the tenant's namespace of each target member, so a reference to
//! another namespace would hand the tenant whatever the controller may read there (the member
//! kubeconfigs). The CRD refuses `credentialsRef.namespace` (a CEL rule); an object written
//! before that rule existed is decided here: its own namespace is accepted, any other refused
//! with `CredentialsOutsideNamespace`, before anything is read or copied. Pure, but for the
//! messages of a Secret that could not be read.

use flotilla_apis::ModelCache;
use flotilla_apis::conditions::{Desired, Status};
use flotilla_apis::constants::{condition, reason};

/// The Secret to read: `(namespace, name)`.
pub type SecretKey = (String, String);

/// The Secret a cache's `credentialsRef` names (`None` without one), or the refusal message
/// when it names another namespace than the cache's.
pub fn secret_to_read(cache: &ModelCache) -> Result<Option<SecretKey>, String> {
    let Some(r) = &cache.spec.credentials_ref else { return Ok(None) };
    let own = cache.metadata.namespace.as_deref().unwrap_or("default");
    match r.namespace.as_deref() {
        None => Ok(Some((own.to_string(), r.name.clone()))),
        Some(ns) if ns == own => Ok(Some((own.to_string(), r.name.clone()))),
        Some(ns) => Err(format!(
            "spec.credentialsRef.namespace: {ns} is not the cache's namespace {own}: a ModelCache reads its \
             credentials Secret in its own namespace only; remove credentialsRef.namespace and put Secret {} in \
             {own}. No Secret was read and nothing was copied to any member",
            r.name
        )),
    }
}

/// The conditions of a cache refused for its `credentialsRef`.
pub fn refused(message: &str) -> Vec<Desired> {
    [condition::ACCEPTED, condition::STAGED, condition::READY]
        .into_iter()
        .map(|t| Desired::new(t, Status::False, reason::CREDENTIALS_OUTSIDE_NAMESPACE, message.to_string()))
        .collect()
}

/// What a target cluster's status says when the Secret could not be read: missing, or the
/// controller may not read it (`forbidden`).
pub fn unreadable(key: &SecretKey, forbidden: bool) -> String {
    let (ns, name) = key;
    if forbidden {
        format!(
            "spec.credentialsRef: the controller may not read Secret {ns}/{name} (403): grant it get on Secrets in \
             {ns} (the chart does for each of controller.tenantNamespaces), or stage without a Secret \
             (spec.serviceAccountName for s3://)"
        )
    } else {
        format!("spec.credentialsRef: Secret {ns}/{name} does not exist: create it with the source's token")
    }
}

#[cfg(test)]
mod tests {
    use flotilla_apis::cache::CacheCredentialsRef;
    use serde_json::json;

    use super::*;

    fn cache(credentials: Option<serde_json::Value>) -> ModelCache {
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "llama", "namespace": "ml"},
            "spec": {"source": "hf://org/llama", "size": "1Gi", "targets": {"deployments": ["chat"]},
                     "credentialsRef": credentials}
        }))
        .unwrap()
    }

    #[test]
    fn only_the_caches_own_namespace_is_read() {
        assert_eq!(secret_to_read(&cache(None)), Ok(None));
        let plain = cache(Some(json!({"name": "hf-token"})));
        assert_eq!(secret_to_read(&plain), Ok(Some(("ml".into(), "hf-token".into()))));
        // Written before the CRD refused the field: the cache's own namespace stays accepted.
        let own = cache(Some(json!({"namespace": "ml", "name": "hf-token"})));
        assert_eq!(secret_to_read(&own), Ok(Some(("ml".into(), "hf-token".into()))));
    }

    #[test]
    fn another_namespace_is_refused_naming_the_field_and_the_fix() {
        let stolen = cache(Some(json!({"namespace": "flotilla-system-members", "name": "eu1", "key": "kubeconfig"})));
        let why = secret_to_read(&stolen).unwrap_err();
        assert!(why.starts_with("spec.credentialsRef.namespace: flotilla-system-members"), "{why}");
        assert!(why.contains("remove credentialsRef.namespace") && why.contains("nothing was copied"), "{why}");
        let c = refused(&why);
        assert_eq!(c.len(), 3);
        assert!(c.iter().all(|d| d.status == Status::False && d.reason == reason::CREDENTIALS_OUTSIDE_NAMESPACE));
        // An empty namespace is not the cache's either.
        let mut empty = cache(None);
        empty.spec.credentials_ref = Some(CacheCredentialsRef { namespace: Some(String::new()), ..Default::default() });
        assert!(secret_to_read(&empty).is_err());
    }

    #[test]
    fn an_unreadable_secret_says_what_to_grant_or_create() {
        let key = ("ml".to_string(), "hf-token".to_string());
        assert!(unreadable(&key, true).contains("may not read Secret ml/hf-token (403)"));
        assert!(unreadable(&key, true).contains("controller.tenantNamespaces"));
        assert!(unreadable(&key, false).contains("Secret ml/hf-token does not exist"));
    }
}
