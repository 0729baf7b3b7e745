//! Per-model behaviour and outages: a fault injected for one served model only (a 429 with
//! `Retry-After`, a 500 or a 503 while the engine's other models answer), a model that is
//! down for a while (its requests get 503 and `/v1/models` leaves it out) and then healthy
//! again, and the whole engine down (every connection is closed before an answer, health
//! checks included). Probes (`GET /health`, `GET /v1/models`) are counted apart from the
//! inference request log. Set from the command line, from tests through [`SimState`], or at
//! runtime with `POST /sim/model {"model", "fault", "count", "down_ms"}`.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::{Fault, SimError, SimState, lock};

/// `MODEL=FAULT` (`--model-fault`): a fault for one model's requests only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFault {
    /// The model.
    pub model: String,
    /// What its requests meet.
    pub fault: Fault,
}

impl FromStr for ModelFault {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        let (model, fault) = s.split_once('=').ok_or_else(|| SimError::BadFault(s.to_string()))?;
        Ok(ModelFault { model: model.to_string(), fault: fault.parse()? })
    }
}

/// `MODEL=MS` (`--model-down`): the model is down for MS milliseconds from the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDown {
    /// The model.
    pub model: String,
    /// For how long.
    pub ms: u64,
}

impl FromStr for ModelDown {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        let bad = || SimError::BadFault(s.to_string());
        let (model, ms) = s.split_once('=').ok_or_else(bad)?;
        Ok(ModelDown { model: model.to_string(), ms: ms.parse().map_err(|_| bad())? })
    }
}

#[derive(Debug, Default)]
struct PerModel {
    fault: Option<(Fault, Option<u32>)>,
    down_until: Option<Instant>,
}

/// Per-model faults, outages and probe counts of one engine.
#[derive(Debug, Default)]
pub struct Outages {
    models: Mutex<HashMap<String, PerModel>>,
    engine_down_until: Mutex<Option<Instant>>,
    probes: AtomicU64,
    refused: AtomicU64,
}

impl Outages {
    /// From the command line's `--model-fault` and `--model-down`.
    pub fn new(faults: &[ModelFault], down: &[ModelDown]) -> Self {
        let o = Outages::default();
        let now = Instant::now();
        let mut m = lock(&o.models);
        for f in faults {
            m.entry(f.model.clone()).or_default().fault = Some((f.fault, None));
        }
        for d in down {
            m.entry(d.model.clone()).or_default().down_until = Some(now + Duration::from_millis(d.ms));
        }
        drop(m);
        o
    }
}

impl SimState {
    /// Inject `fault` into the next `count` requests for `model` only (`None`: until cleared).
    pub fn set_model_fault(&self, model: &str, fault: Option<Fault>, count: Option<u32>) {
        lock(&self.outages.models).entry(model.to_string()).or_default().fault = fault.map(|f| (f, count));
    }

    /// `model` is down (503, left out of `/v1/models`) for `for_` from now, then healthy.
    pub fn set_model_down(&self, model: &str, for_: Duration) {
        lock(&self.outages.models).entry(model.to_string()).or_default().down_until = Some(Instant::now() + for_);
    }

    /// The whole engine is down for `for_` from now (`None`: up again now): every connection
    /// is closed before an answer.
    pub fn set_engine_down(&self, for_: Option<Duration>) {
        *lock(&self.outages.engine_down_until) = for_.map(|d| Instant::now() + d);
    }

    /// Whether the whole engine is down now.
    pub fn engine_down(&self) -> bool {
        lock(&self.outages.engine_down_until).is_some_and(|t| Instant::now() < t)
    }

    /// Whether `model` is down now.
    pub fn model_down(&self, model: &str) -> bool {
        lock(&self.outages.models).get(model).and_then(|m| m.down_until).is_some_and(|t| Instant::now() < t)
    }

    /// Health checks (`GET /health`, `GET /v1/models`) received, the engine down or not.
    pub fn probes(&self) -> u64 {
        self.outages.probes.load(Ordering::Relaxed)
    }

    /// Requests other than probes whose connection was closed while the engine was down.
    pub fn refused(&self) -> u64 {
        self.outages.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn count_probe(&self) {
        self.outages.probes.fetch_add(1, Ordering::Relaxed);
    }

    /// Inference requests received for `model`.
    pub fn requests_for(&self, model: &str) -> usize {
        self.requests().iter().filter(|r| r.model == model).count()
    }

    /// The fault a request for `model` meets: 503 while the model is down, else its own fault
    /// (consuming one use), else the engine-wide one.
    pub(crate) fn fault_for(&self, model: &str) -> Option<Fault> {
        let own = {
            let mut models = lock(&self.outages.models);
            match models.get_mut(model) {
                Some(m) if m.down_until.is_some_and(|t| Instant::now() < t) => Some(Fault::Error503),
                Some(m) => match m.fault {
                    Some((f, None)) => Some(f),
                    Some((f, Some(n))) => {
                        m.fault = (n > 1).then_some((f, Some(n - 1)));
                        (n > 0).then_some(f)
                    }
                    None => None,
                },
                None => None,
            }
        };
        own.or_else(|| self.take_fault())
    }
}

/// The accept loop's hook: while the whole engine is down, count a probe and close the
/// connection (`true`: the request gets no answer).
pub(crate) fn engine_down_hook(s: &SimState, path: &str, kill: &Arc<tokio::sync::Notify>) -> bool {
    if !s.engine_down() {
        return false;
    }
    if matches!(path, "/health" | "/v1/models") {
        s.count_probe();
    } else {
        s.outages.refused.fetch_add(1, Ordering::Relaxed);
    }
    kill.notify_one();
    true
}

/// `POST /sim/model {"model": "m", "fault": "rate-limit:30", "count": 1, "down_ms": 3000}`:
/// `fault` null clears the model's fault; `down_ms` takes the model down for that long.
pub(crate) async fn set_model(State(s): State<Arc<SimState>>, Json(v): Json<Value>) -> Response {
    let Some(model) = v["model"].as_str() else {
        return (StatusCode::BAD_REQUEST, "`model` is required").into_response();
    };
    let count = v["count"].as_u64().map(|c| u32::try_from(c).unwrap_or(u32::MAX));
    match v.get("fault").map(|f| f.as_str().map(str::parse::<Fault>)) {
        Some(Some(Err(e))) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        Some(Some(Ok(f))) => s.set_model_fault(model, Some(f), count),
        Some(None) => s.set_model_fault(model, None, None),
        None => {}
    }
    if let Some(ms) = v["down_ms"].as_u64() {
        s.set_model_down(model, Duration::from_millis(ms));
    }
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimConfig;

    #[test]
    fn a_model_fault_hits_only_its_model_and_a_down_model_comes_back() {
        let s = SimState::new(SimConfig {
            models: vec!["a".into(), "b".into()],
            model_faults: vec!["a=rate-limit:30".parse().unwrap()],
            ..SimConfig::default()
        });
        assert_eq!(s.fault_for("a"), Some(Fault::RateLimit(Some(30))));
        assert_eq!(s.fault_for("a"), Some(Fault::RateLimit(Some(30))), "until cleared");
        assert_eq!(s.fault_for("b"), None);
        s.set_model_fault("b", Some(Fault::Error500), Some(1));
        assert_eq!(s.fault_for("b"), Some(Fault::Error500));
        assert_eq!(s.fault_for("b"), None, "used up");
        s.set_model_down("b", Duration::from_secs(60));
        assert!(s.model_down("b") && !s.model_down("a"));
        assert_eq!(s.fault_for("b"), Some(Fault::Error503));
        s.set_model_down("b", Duration::ZERO);
        assert!(!s.model_down("b"));
        assert!("a=explode".parse::<ModelFault>().is_err());
        assert_eq!("m=1500".parse::<ModelDown>().unwrap(), ModelDown { model: "m".into(), ms: 1500 });
    }
}
