//! Scale to zero, the request side. A request for a model marked `scaleToZero` that has no
//! Ready route is held by whichever gateway replica received it (within the caps of `queue`,
//! each at most `--activation-timeout-ms`; it gives its concurrency slot back while it waits
//! and takes one again when it goes on), and that replica asks for a replica:
//! the model's name goes to the activation writer, which raises the ModelDeployment's scale
//! subresource from 0 to 1 (a write conditional on the scale's resourceVersion, so many
//! replicas asking at once make one change). Every routing-table swap wakes the held
//! requests; they go on as soon as a Ready route is in the table, or end with a 503 and
//! `Retry-After`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use crate::autoscale::metrics::HeldResult;
use crate::autoscale::queue::{HoldCaps, Queue};
use crate::config::ms;
use crate::health::lock;
use crate::table::RoutingTable;
use crate::{AppState, GatewayError};

/// How often a held request asks for the activation again.
const RESEND: Duration = Duration::from_secs(5);

/// Held requests, the table-swap signal that wakes them, and the channel to the writer.
#[derive(Debug)]
pub struct Activation {
    tables: watch::Sender<u64>,
    held: Mutex<Queue>,
    first: Mutex<HashMap<String, Instant>>,
    /// When this replica raised each model from zero (for the leader's cold-start figure).
    activated: Mutex<HashMap<String, Instant>>,
    writer: OnceLock<mpsc::UnboundedSender<String>>,
}

impl Default for Activation {
    fn default() -> Self {
        Activation {
            tables: watch::Sender::new(0),
            held: Mutex::new(Queue::default()),
            first: Mutex::new(HashMap::new()),
            activated: Mutex::new(HashMap::new()),
            writer: OnceLock::new(),
        }
    }
}

impl Activation {
    /// A new routing table is in force: held requests look again.
    pub fn table_changed(&self) {
        self.tables.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Send activations to `tx` (control-cluster mode); without it requests are held only.
    pub fn connect(&self, tx: mpsc::UnboundedSender<String>) {
        let _ = self.writer.set(tx);
    }

    /// This replica raised `model` from zero just now.
    pub fn activated(&self, model: &str) {
        lock(&self.activated).insert(model.to_string(), Instant::now());
    }

    /// When this replica raised `model` from zero, once (`None`: another replica did).
    pub fn take_activated(&self, model: &str) -> Option<Instant> {
        lock(&self.activated).remove(model)
    }

    /// Requests held now for `model` on this replica.
    pub fn held(&self, model: &str) -> usize {
        lock(&self.held).model(model).requests
    }

    /// Requests held now on this replica, for every model.
    pub fn held_total(&self) -> usize {
        lock(&self.held).total().requests
    }
}

/// Counts a held request until it leaves, however it leaves (the client may go away).
struct Held<'a> {
    st: &'a AppState,
    model: &'a str,
    bytes: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let a = &self.st.autoscale.activation;
        let mut held = lock(&a.held);
        if held.leave(self.model, self.bytes) {
            lock(&a.first).remove(self.model);
        }
        self.st.metrics.autoscale.held(self.model, -1);
        self.st.metrics.autoscale.held_bytes(held.total().bytes);
    }
}

/// `None`: the model is gone; `Some(true)`: send the request now.
fn go(table: &RoutingTable, model: &str) -> Option<bool> {
    let m = table.resolve(model)?;
    Some(!m.scale_to_zero || !table.allowed_routes(m, &[&m.sovereignty]).is_empty())
}

/// Returns `permit` at once unless `model` is scaled to zero with no Ready route; then gives
/// it back and holds the request (its body `bytes` long) until a route is Ready, and goes on
/// with a fresh permit (`Ok`); or a 503: the wait expired, a cap of `queue` is reached, or no
/// concurrency slot is free once the route is Ready (`--max-concurrency`).
pub async fn hold(
    st: &AppState,
    model: &str,
    bytes: usize,
    permit: OwnedSemaphorePermit,
) -> Result<OwnedSemaphorePermit, GatewayError> {
    let a = &st.autoscale.activation;
    let mut tables = a.tables.subscribe();
    if go(&st.table.load(), model).unwrap_or(true) {
        return Ok(permit);
    }
    // A held request waits without a slot: warm models keep theirs (the caps bound the held).
    drop(permit);
    let retry_after = st.cfg.activation_retry_after_s;
    {
        let mut held = lock(&a.held);
        let caps = HoldCaps::from_config(&st.cfg);
        if let Err(cap) = held.enter(model, bytes, &caps) {
            st.metrics.autoscale.held_result(HeldResult::queue_full);
            st.metrics.autoscale.held_refused(cap);
            return Err(GatewayError::ActivationQueueFull {
                model: model.to_string(),
                why: format!("{} on this gateway replica ({})", cap.describe(&caps), cap.flag()),
                retry_after,
            });
        }
        st.metrics.autoscale.held_bytes(held.total().bytes);
    }
    st.metrics.autoscale.held(model, 1);
    let _held = Held { st, model, bytes };
    let started = Instant::now();
    lock(&a.first).entry(model.to_string()).or_insert(started);
    if let Some(tx) = a.writer.get() {
        let _ = tx.send(model.to_string());
    }
    tracing::info!(model, "model is scaled to zero: request held while a replica starts");
    let deadline = tokio::time::Instant::from_std(started + ms(st.cfg.activation_timeout_ms));
    loop {
        drop(tables.borrow_and_update());
        match go(&st.table.load(), model) {
            None => return Err(GatewayError::UnknownModel(model.to_string())),
            Some(true) => {
                st.metrics.autoscale.held_result(HeldResult::served);
                st.metrics.autoscale.held_wait(started.elapsed().as_secs_f64());
                if let Some(first) = lock(&a.first).remove(model) {
                    st.metrics.autoscale.cold_start(first.elapsed().as_secs_f64());
                }
                return st
                    .limit
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| GatewayError::Overloaded(st.cfg.max_concurrency));
            }
            Some(false) => {}
        }
        // Woken by a table swap; every few seconds the activation is asked for again (the
        // write may have failed, or the replica been removed again meanwhile).
        let wake = deadline.min(tokio::time::Instant::now() + RESEND);
        match tokio::time::timeout_at(wake, tables.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) => tokio::time::sleep_until(wake).await,
            Err(_) => {}
        }
        if tokio::time::Instant::now() < deadline {
            if let Some(tx) = a.writer.get() {
                let _ = tx.send(model.to_string());
            }
        } else {
            st.metrics.autoscale.held_result(HeldResult::expired);
            return Err(GatewayError::Activating {
                model: model.to_string(),
                why: format!(
                    "no replica became Ready within {} ms of the request (--activation-timeout-ms)",
                    st.cfg.activation_timeout_ms
                ),
                retry_after,
            });
        }
    }
}
