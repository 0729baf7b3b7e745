//! Another installation's staging objects in a member, beside this installation's orphans: the
//! sweep, reading the ModelCache kinds from the staging watches, deletes its own installation's
//! orphaned Job, volume claim and Secret, and never touches the other installation's objects of
//! the same shape, owner and cluster.

use super::*;

/// `managed-by=flotilla` staging objects of ModelCache `ml/ghost` (which does not exist), written
/// through InferenceCluster m1 by installation `install`: a Secret, a volume claim and a Job.
async fn plant(member: &Client, prefix: &str, install: &str) -> Vec<String> {
    let labels = json!({"app.kubernetes.io/managed-by": "flotilla", "flotilla.dev/cache": "ml.ghost",
                        "flotilla.dev/install": install, "flotilla.dev/cluster": "m1"});
    let meta = |name: &str| json!({"name": name, "labels": labels.clone()});
    let secret: Secret =
        serde_json::from_value(json!({"metadata": meta(&format!("{prefix}-ghost-credentials")), "type": "Opaque"}))
            .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": meta(&format!("{prefix}-ghost")),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    let job: Job = serde_json::from_value(json!({"metadata": meta(&format!("{prefix}-ghost")),
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "stage", "image": "flotilla-stage:e2e"}]}}}}))
    .unwrap();
    let pp = PostParams::default();
    let mut uids = Vec::new();
    uids.push(Api::<Secret>::namespaced(member.clone(), "ml").create(&pp, &secret).await.unwrap().uid().unwrap());
    uids.push(
        Api::<PersistentVolumeClaim>::namespaced(member.clone(), "ml").create(&pp, &pvc).await.unwrap().uid().unwrap(),
    );
    uids.push(Api::<Job>::namespaced(member.clone(), "ml").create(&pp, &job).await.unwrap().uid().unwrap());
    uids
}

/// Of `prefix`'s three objects in m1's `ml`: the uids of those present and not being deleted.
async fn standing(member: &Client, prefix: &str) -> Vec<String> {
    let ns = "ml";
    let alive = |m: &kube::api::ObjectMeta| m.deletion_timestamp.is_none();
    let mut out = Vec::new();
    let s = Api::<Secret>::namespaced(member.clone(), ns).get_opt(&format!("{prefix}-ghost-credentials")).await;
    out.extend(s.unwrap().filter(|o| alive(&o.metadata)).and_then(|o| o.uid()));
    let p = Api::<PersistentVolumeClaim>::namespaced(member.clone(), ns).get_opt(&format!("{prefix}-ghost")).await;
    out.extend(p.unwrap().filter(|o| alive(&o.metadata)).and_then(|o| o.uid()));
    let j = Api::<Job>::namespaced(member.clone(), ns).get_opt(&format!("{prefix}-ghost")).await;
    out.extend(j.unwrap().filter(|o| alive(&o.metadata)).and_then(|o| o.uid()));
    out
}

pub async fn another_installations_staging_objects_survive_the_sweep(control: &Client, m1: &Client) {
    let ours = Api::<Namespace>::all(control.clone()).get("kube-system").await.unwrap().metadata.uid.unwrap();
    let theirs = plant(m1, "theirs", "e2e-other-install").await;
    let mine = plant(m1, "ours", &ours).await;
    assert_eq!(mine.len(), 3);
    // The sweep (every 4 s, grace 2 s) removes this installation's orphans: it acts on this path.
    wait_for("this installation's orphaned staging objects swept", Duration::from_secs(60), || async {
        standing(m1, "ours").await.is_empty().then_some(())
    })
    .await;
    // Two more passes, then the other installation's are all there, the same objects.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(standing(m1, "theirs").await, theirs, "another installation's staging objects are never touched");
}
