//! The JSON merge patch that writes a status. Status types leave empty fields out when
//! serialized (`skip_serializing_if`), and a merge patch that leaves a field out keeps the
//! server's value: a deployment that became fully placed kept its old `unplaced`, and the
//! reconcile that compared it with the fresh status wrote again every time. The patch
//! therefore names every top-level field the current status has and the new one lacks, with
//! `null`, which deletes it. `write_status` (over `conditional_status_patch`) is the one status
//! write every kind uses: no request when nothing changed, else this patch, conditional on the
//! `resourceVersion` it was decided from; a conflict is `Error::Stale`, looked at again shortly.

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `{"status": new}`, with `null` for each field of `current` that `new` no longer has (in
/// nested objects too; lists are replaced whole by a merge patch anyway).
pub fn status_patch<T: Serialize>(current: Option<&T>, new: &T) -> Result<serde_json::Value, serde_json::Error> {
    let mut status = serde_json::to_value(new)?;
    if let Some(current) = current {
        null_missing(&serde_json::to_value(current)?, &mut status);
    }
    Ok(serde_json::json!({ "status": status }))
}

/// The status write that takes `current` (read at `resource_version`) to `next`: `None` when
/// they are equal (a quiet object makes no write); otherwise `status_patch` with
/// `metadata.resourceVersion`, so a write decided from a stale copy fails with a conflict
/// instead of dropping what another writer added since.
pub fn conditional_status_patch<T: Serialize + PartialEq>(
    current: Option<&T>,
    resource_version: Option<String>,
    next: &T,
) -> Result<Option<serde_json::Value>, serde_json::Error> {
    if current == Some(next) {
        return Ok(None);
    }
    let mut patch = status_patch(current, next)?;
    patch["metadata"] = serde_json::json!({ "resourceVersion": resource_version });
    Ok(Some(patch))
}

/// Writes `next` as the status of the object `name` when it differs from `current` (its status
/// as of `resource_version`). `Ok(None)`: equal, no request sent. `Ok(Some(written))`: the
/// object as the server returned it (its new resourceVersion and status are the base of a
/// later write in the same reconcile). The object having changed since it was read (409) is
/// [`crate::Error::Stale`]: nothing is lost, the next reconcile decides again from fresh data.
pub async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    current: Option<&S>,
    resource_version: Option<String>,
    next: &S,
    params: &PatchParams,
) -> Result<Option<K>, crate::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    let Some(patch) = conditional_status_patch(current, resource_version, next).map_err(kube::Error::SerdeError)?
    else {
        return Ok(None);
    };
    match api.patch_status(name, params, &Patch::Merge(&patch)).await {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(crate::Error::Stale(format!("status of {name} not written: {}", s.message)))
        }
        Err(e) => Err(e.into()),
    }
}

fn null_missing(old: &serde_json::Value, new: &mut serde_json::Value) {
    let (serde_json::Value::Object(old), serde_json::Value::Object(new)) = (old, new) else { return };
    for (key, was) in old {
        match new.get_mut(key) {
            Some(now) => null_missing(was, now),
            None => {
                new.insert(key.clone(), serde_json::Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use flotilla_apis::ModelDeploymentStatus;
    use flotilla_apis::deployment::Unplaced;
    use serde_json::json;

    use super::{conditional_status_patch, status_patch};

    #[test]
    fn fields_that_went_away_are_deleted() {
        let old = ModelDeploymentStatus {
            unplaced: Some(Unplaced { replicas: 2, reasons: vec![] }),
            clusters: Some("eu1:0/2".into()),
            ..Default::default()
        };
        let new = ModelDeploymentStatus { replicas: 2, ..Default::default() };
        let patch = status_patch(Some(&old), &new).unwrap();
        assert_eq!(patch["status"]["unplaced"], json!(null));
        assert_eq!(patch["status"]["clusters"], json!(null));
        assert_eq!(patch["status"]["replicas"], json!(2));
        // What only the new status has is written as is; nothing else is nulled.
        let patch = status_patch(None, &old).unwrap();
        assert_eq!(patch["status"]["unplaced"]["replicas"], json!(2));
        assert!(patch["status"].as_object().unwrap().values().all(|v| !v.is_null()));
    }

    #[test]
    fn an_unchanged_status_is_not_written_and_a_changed_one_only_on_its_version() {
        let old = ModelDeploymentStatus { replicas: 2, clusters: Some("eu1:2/2".into()), ..Default::default() };
        assert_eq!(conditional_status_patch(Some(&old), Some("7".into()), &old.clone()).unwrap(), None);
        let new = ModelDeploymentStatus { replicas: 3, ..Default::default() };
        let patch = conditional_status_patch(Some(&old), Some("7".into()), &new).unwrap().unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], json!("7"));
        assert_eq!(patch["status"]["clusters"], json!(null));
        assert_eq!(patch["status"]["replicas"], json!(3));
    }
}
