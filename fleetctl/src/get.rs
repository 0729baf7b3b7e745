//! `fleetctl get`: lists one kind of Flotilla object from the control cluster (one namespace,
//! every namespace, or one object by name) and prints it as a table ([`crate::tables`]) or as
//! the API server's JSON/YAML without `managedFields`.

use std::io::Write;
use std::process::ExitCode;

use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde::Serialize;

use crate::cli::{GetOutput, Kind};
use crate::live::{self, ClusterArgs, LiveError};
use crate::progress::Progress;
use crate::tables::{self, TableOptions};

/// Which namespaces to list.
#[derive(Clone, Debug)]
pub enum Scope {
    /// One (`None`: the context's namespace).
    Namespace(Option<String>),
    /// Every namespace.
    All,
}

/// Objects of one kind.
#[derive(Debug)]
pub enum Items {
    /// InferenceClusters.
    Clusters(Vec<InferenceCluster>),
    /// ModelDeployments.
    Deployments(Vec<ModelDeployment>),
    /// ModelCaches.
    Caches(Vec<ModelCache>),
    /// CapacityClaims.
    Claims(Vec<CapacityClaim>),
    /// InferenceClasses.
    Classes(Vec<InferenceClass>),
}

impl Items {
    fn len(&self) -> usize {
        match self {
            Self::Clusters(v) => v.len(),
            Self::Deployments(v) => v.len(),
            Self::Caches(v) => v.len(),
            Self::Claims(v) => v.len(),
            Self::Classes(v) => v.len(),
        }
    }

    /// The table of these objects.
    pub fn table(&self, opts: &TableOptions) -> String {
        match self {
            Self::Clusters(v) => tables::clusters(v, opts),
            Self::Deployments(v) => tables::deployments(v, opts),
            Self::Caches(v) => tables::caches(v, opts),
            Self::Claims(v) => tables::claims(v, opts),
            Self::Classes(v) => tables::classes(v, opts),
        }
    }

    /// Each object as JSON, without `metadata.managedFields`.
    pub fn values(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        fn each<T: Serialize>(v: &[T]) -> anyhow::Result<Vec<serde_json::Value>> {
            v.iter().map(|o| Ok(serde_json::to_value(o)?)).collect()
        }
        let mut values = match self {
            Self::Clusters(v) => each(v)?,
            Self::Deployments(v) => each(v)?,
            Self::Caches(v) => each(v)?,
            Self::Claims(v) => each(v)?,
            Self::Classes(v) => each(v)?,
        };
        for v in &mut values {
            if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.remove("managedFields");
            }
        }
        Ok(values)
    }
}

fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::Clusters => "inferenceclusters.flotilla.dev",
        Kind::Deployments => "modeldeployments.flotilla.dev",
        Kind::Caches => "modelcaches.flotilla.dev",
        Kind::Claims => "capacityclaims.flotilla.dev",
        Kind::Classes => "inferenceclasses.flotilla.dev",
    }
}

/// `fleetctl get`.
pub fn get(
    kind: Kind,
    name: Option<&str>,
    scope: Scope,
    output: GetOutput,
    cluster: &ClusterArgs,
) -> anyhow::Result<ExitCode> {
    let what = plural(kind);
    let progress = Progress::start(format!("reading {what}"));
    let result = live::block_on(async {
        let control = live::connect(cluster).await?;
        let ns: Option<String> = match scope {
            Scope::All => None,
            Scope::Namespace(n) => Some(n.unwrap_or_else(|| control.namespace.clone())),
        };
        let c = control.client.clone();
        let items = match kind {
            Kind::Clusters => Items::Clusters(control.list(Api::all(c), what, name).await?),
            Kind::Classes => Items::Classes(control.list(Api::all(c), what, name).await?),
            Kind::Deployments => Items::Deployments(control.list(control.namespaced(ns.as_deref()), what, name).await?),
            Kind::Caches => Items::Caches(control.list(control.namespaced(ns.as_deref()), what, name).await?),
            Kind::Claims => Items::Claims(control.list(control.namespaced(ns.as_deref()), what, name).await?),
        };
        Ok::<_, LiveError>((items, ns))
    })?;
    progress.finish();
    let (items, ns) = result?;
    let place = match (&ns, kind.namespaced()) {
        (Some(ns), true) => format!(" in namespace {ns}"),
        (None, true) => " in any namespace".to_string(),
        _ => String::new(),
    };
    if let Some(name) = name
        && items.len() == 0
    {
        eprintln!("error: {what} {name:?} not found{place}");
        return Ok(ExitCode::from(1));
    }
    match output {
        GetOutput::Table | GetOutput::Wide => {
            if items.len() == 0 {
                eprintln!("No {what} found{place}.");
                return Ok(ExitCode::SUCCESS);
            }
            let opts = TableOptions {
                wide: output == GetOutput::Wide,
                namespace_column: ns.is_none() && kind.namespaced(),
                now: Timestamp::now(),
            };
            std::io::stdout().write_all(items.table(&opts).as_bytes())?;
        }
        GetOutput::Json | GetOutput::Yaml => {
            let mut values = items.values()?;
            let doc = match (name, values.len()) {
                (Some(_), 1) => values.remove(0),
                _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": values}),
            };
            let text = if output == GetOutput::Json {
                serde_json::to_string_pretty(&doc)? + "\n"
            } else {
                serde_yaml_ng::to_string(&doc)?
            };
            std::io::stdout().write_all(text.as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
