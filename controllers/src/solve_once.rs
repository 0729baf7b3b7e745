//! One value per key, computed once: the fleet plan keyed by the fingerprint of the objects it
//! is solved from. The computation runs on a blocking thread (the solver is CPU-bound and must
//! not hold an async worker that also drives watches), one at a time; callers that arrive while
//! it runs wait for it and then share its result when their key is the same. A panic in the
//! computation, or an error it returns, is an error for the callers (nothing is cached), not a
//! dead worker. Each computed value gets the
//! next sequence number, so callers can tell which of two values is newer. Besides its key, a
//! value may say itself whether it still holds (`still`): the fleet plan does while
//! deployments only record what it decided.

use std::sync::Arc;

/// The last value with its key and sequence number, behind an async lock held across the
/// computation.
pub struct SolveOnce<V> {
    last: tokio::sync::Mutex<Option<(u64, u64, Arc<V>)>>,
}

impl<V> Default for SolveOnce<V> {
    fn default() -> Self {
        Self { last: tokio::sync::Mutex::new(None) }
    }
}

impl<V: Send + Sync + 'static> SolveOnce<V> {
    /// The value for the key `key()` returns (read under the lock, so a caller that waited sees
    /// the newest key): the cached one when the key is unchanged and `still` accepts it, else
    /// `input()` handed to
    /// `compute` on a blocking thread. `key` runs before `input`: a change landing between them
    /// leaves a key older than the value, so the next call computes again rather than keep a
    /// value older than its key. Returns the value with its sequence number (1 for the first
    /// value computed, one more for each later one).
    pub async fn get<I: Send + 'static>(
        &self,
        key: impl FnOnce() -> u64,
        still: impl FnOnce(&V) -> bool,
        input: impl FnOnce() -> I,
        compute: impl FnOnce(I) -> Result<V, String> + Send + 'static,
    ) -> Result<(u64, Arc<V>), String> {
        let mut last = self.last.lock().await;
        let key = key();
        if let Some((k, seq, v)) = last.as_ref()
            && *k == key
            && still(v)
        {
            return Ok((*seq, v.clone()));
        }
        let seq = last.as_ref().map_or(0, |(_, s, _)| *s) + 1;
        let input = input();
        let value = Arc::new(tokio::task::spawn_blocking(move || compute(input)).await.map_err(|e| e.to_string())??);
        *last = Some((key, seq, value.clone()));
        Ok((seq, value))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_with_one_key_share_one_computation() {
        let once = Arc::new(SolveOnce::<u32>::default());
        let runs = Arc::new(AtomicU32::new(0));
        let calls = (0..8).map(|_| {
            let (once, runs) = (once.clone(), runs.clone());
            tokio::spawn(async move {
                once.get(
                    || 7,
                    |_| true,
                    || (),
                    move |()| {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok(runs.fetch_add(1, Ordering::SeqCst) + 100)
                    },
                )
                .await
            })
        });
        let values: Vec<u32> =
            futures_util::future::join_all(calls).await.into_iter().map(|r| *r.unwrap().unwrap().1).collect();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "eight reconciles, one solve");
        assert!(values.iter().all(|v| *v == 100));
        assert_eq!(once.get(|| 7, |_| true, || (), |()| Ok(0)).await.unwrap().0, 1, "the first value is number 1");
        // A new key computes again, and its value is newer.
        let (seq, v) = once.get(|| 8, |_| true, || (), |()| Ok(5)).await.unwrap();
        assert_eq!((seq, *v), (2, 5));
        // The same key, but the value says it no longer holds: computed again.
        assert_eq!(*once.get(|| 8, |v| *v != 5, || (), |()| Ok(6)).await.unwrap().1, 6);
        assert_eq!(*once.get(|| 8, |v| *v != 5, || (), |()| Ok(7)).await.unwrap().1, 6, "6 still holds");
    }

    #[tokio::test]
    async fn a_panicking_computation_is_an_error_and_the_next_call_computes_again() {
        let once = SolveOnce::<u32>::default();
        let err =
            once.get(|| 1, |_| true, || (), |()| -> Result<u32, String> { panic!("solver bug") }).await.unwrap_err();
        assert!(err.contains("panic"), "{err}");
        let err =
            once.get(|| 1, |_| true, || (), |()| -> Result<u32, String> { Err("no plan".into()) }).await.unwrap_err();
        assert_eq!(err, "no plan");
        assert_eq!(*once.get(|| 1, |_| true, || (), |()| Ok(3)).await.unwrap().1, 3);
    }
}
