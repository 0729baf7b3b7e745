//! What requests held for models scaled to zero may take of one gateway replica. A request
//! asks to be held with its body's size; `admit` decides against four caps — requests and
//! buffered body bytes, per model (`--activation-queue`, `--activation-queue-bytes`) and for
//! every model together (`--activation-queue-total`, `--activation-queue-total-bytes`) —
//! and names the first one it would cross. A held request takes no concurrency slot: the caps
//! are what bound them, so cold models cannot starve warm ones of slots or memory.

use std::collections::HashMap;

use prometheus_client::encoding::EncodeLabelValue;

use crate::GatewayConfig;

/// Which cap a request would have crossed (`held_requests_refused_total{cap}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum HoldCap {
    /// Requests held for the model (`--activation-queue`).
    model_requests,
    /// Body bytes held for the model (`--activation-queue-bytes`).
    model_bytes,
    /// Requests held for every model (`--activation-queue-total`).
    total_requests,
    /// Body bytes held for every model (`--activation-queue-total-bytes`).
    total_bytes,
}

impl HoldCap {
    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            HoldCap::model_requests => "--activation-queue",
            HoldCap::model_bytes => "--activation-queue-bytes",
            HoldCap::total_requests => "--activation-queue-total",
            HoldCap::total_bytes => "--activation-queue-total-bytes",
        }
    }

    /// What is full, for the client's message.
    pub fn describe(self, caps: &HoldCaps) -> String {
        match self {
            HoldCap::model_requests => format!("{} requests for it are already held", caps.model_requests),
            HoldCap::model_bytes => {
                format!("the requests held for it would exceed {} body bytes", caps.model_bytes)
            }
            HoldCap::total_requests => {
                format!("{} requests for models starting from zero are already held", caps.total_requests)
            }
            HoldCap::total_bytes => {
                format!("the requests held for models starting from zero would exceed {} body bytes", caps.total_bytes)
            }
        }
    }
}

/// The four caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldCaps {
    /// Requests per model.
    pub model_requests: usize,
    /// Body bytes per model.
    pub model_bytes: usize,
    /// Requests for every model.
    pub total_requests: usize,
    /// Body bytes for every model.
    pub total_bytes: usize,
}

impl HoldCaps {
    /// The caps of `cfg`.
    pub fn from_config(cfg: &GatewayConfig) -> Self {
        HoldCaps {
            model_requests: cfg.activation_queue,
            model_bytes: cfg.activation_queue_bytes,
            total_requests: cfg.activation_queue_total,
            total_bytes: cfg.activation_queue_total_bytes,
        }
    }
}

/// Requests and body bytes held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests.
    pub requests: usize,
    /// Body bytes.
    pub bytes: usize,
}

/// Whether one more request of `bytes` may be held, given what is held for its model and for
/// every model: `None` when it fits, else the first cap it would cross (the model's before
/// the total's, requests before bytes).
pub fn admit(model: Load, total: Load, bytes: usize, caps: &HoldCaps) -> Option<HoldCap> {
    if model.requests >= caps.model_requests {
        Some(HoldCap::model_requests)
    } else if model.bytes.saturating_add(bytes) > caps.model_bytes {
        Some(HoldCap::model_bytes)
    } else if total.requests >= caps.total_requests {
        Some(HoldCap::total_requests)
    } else if total.bytes.saturating_add(bytes) > caps.total_bytes {
        Some(HoldCap::total_bytes)
    } else {
        None
    }
}

/// What is held now, per model and in all.
#[derive(Debug, Default)]
pub struct Queue {
    models: HashMap<String, Load>,
    total: Load,
}

impl Queue {
    /// Hold one more request of `bytes` for `model` unless a cap says no.
    pub fn enter(&mut self, model: &str, bytes: usize, caps: &HoldCaps) -> Result<(), HoldCap> {
        let mine = self.models.get(model).copied().unwrap_or_default();
        if let Some(cap) = admit(mine, self.total, bytes, caps) {
            return Err(cap);
        }
        let m = self.models.entry(model.to_string()).or_default();
        m.requests += 1;
        m.bytes += bytes;
        self.total.requests += 1;
        self.total.bytes += bytes;
        Ok(())
    }

    /// A request of `bytes` for `model` left; `true` when none is held for it any more.
    pub fn leave(&mut self, model: &str, bytes: usize) -> bool {
        self.total.requests = self.total.requests.saturating_sub(1);
        self.total.bytes = self.total.bytes.saturating_sub(bytes);
        let Some(m) = self.models.get_mut(model) else { return true };
        m.requests = m.requests.saturating_sub(1);
        m.bytes = m.bytes.saturating_sub(bytes);
        if m.requests == 0 {
            self.models.remove(model);
            return true;
        }
        false
    }

    /// What is held for `model`.
    pub fn model(&self, model: &str) -> Load {
        self.models.get(model).copied().unwrap_or_default()
    }

    /// What is held for every model.
    pub fn total(&self) -> Load {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: HoldCaps = HoldCaps { model_requests: 2, model_bytes: 100, total_requests: 3, total_bytes: 150 };

    #[test]
    fn each_cap_is_named_the_models_first() {
        let l = |requests, bytes| Load { requests, bytes };
        assert_eq!(admit(l(0, 0), l(0, 0), 100, &CAPS), None, "a cap is reached, not crossed");
        assert_eq!(admit(l(2, 0), l(2, 0), 1, &CAPS), Some(HoldCap::model_requests));
        assert_eq!(admit(l(1, 60), l(1, 60), 41, &CAPS), Some(HoldCap::model_bytes));
        assert_eq!(admit(l(0, 0), l(3, 0), 1, &CAPS), Some(HoldCap::total_requests));
        assert_eq!(admit(l(0, 0), l(2, 100), 51, &CAPS), Some(HoldCap::total_bytes));
        assert_eq!(admit(l(2, 100), l(3, 150), 1, &CAPS), Some(HoldCap::model_requests));
        assert_eq!(admit(l(0, 0), l(0, 0), usize::MAX, &CAPS), Some(HoldCap::model_bytes), "no overflow");
    }

    #[test]
    fn the_queue_counts_in_and_out_per_model_and_in_all() {
        let mut q = Queue::default();
        assert_eq!(q.enter("a", 60, &CAPS), Ok(()));
        assert_eq!(q.enter("a", 60, &CAPS), Err(HoldCap::model_bytes));
        assert_eq!(q.enter("a", 40, &CAPS), Ok(()));
        assert_eq!(q.enter("a", 0, &CAPS), Err(HoldCap::model_requests));
        assert_eq!(q.enter("b", 51, &CAPS), Err(HoldCap::total_bytes));
        assert_eq!(q.enter("b", 50, &CAPS), Ok(()));
        assert_eq!(q.enter("c", 0, &CAPS), Err(HoldCap::total_requests));
        assert_eq!(q.total(), Load { requests: 3, bytes: 150 });
        assert!(!q.leave("a", 60));
        assert_eq!(q.model("a"), Load { requests: 1, bytes: 40 });
        assert_eq!(q.enter("c", 0, &CAPS), Ok(()), "room again");
        assert!(q.leave("a", 40));
        assert!(q.leave("b", 50));
        assert!(q.leave("c", 0));
        assert_eq!((q.total(), q.model("a")), (Load::default(), Load::default()));
    }
}
