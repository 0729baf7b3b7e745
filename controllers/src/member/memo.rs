//! Read-after-write for the member caches. Right after Flotilla applies or deletes a member
//! object, the watch cache may still show the object as it was (or not at all): a reconcile
//! in between must neither write it again nor call the old spec drift. So every write is
//! remembered — per object, the content hash Flotilla applied and the `resourceVersion` the API
//! server answered with, or that it was deleted — and [`judge`] says how to read the cache:
//! once the cached object carries that `resourceVersion` (or a later one) the cache has caught
//! up and is trusted again, the memo dropped; until then the object counts as written with the
//! remembered hash (no drift check), or as gone. A memo older than [`TTL`] is dropped and the
//! cache trusted whatever it shows (a watch that never catches up must not hide a real change
//! for ever: at worst one write is repeated). Pure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a write is trusted over a cache that has not caught up with it.
pub const TTL: Duration = Duration::from_secs(30);

/// One member object: kind (`Deployment`), namespace, name.
pub type Key = (&'static str, String, String);

/// What Flotilla last did to a member object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// Applied content of this hash; the API server answered with this `resourceVersion`.
    Applied {
        /// The rendered hash (the annotation it now carries).
        hash: String,
        /// `metadata.resourceVersion` of the answer.
        resource_version: String,
    },
    /// Deleted it.
    Deleted,
}

/// A remembered write.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The owner label's value (`<namespace>.<name>` of the ModelDeployment).
    pub owner: String,
    /// What was written.
    pub wrote: Wrote,
    /// When.
    pub at: Instant,
}

/// How to read one object of the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// As the cache shows it (or, if absent there, as absent).
    Cache,
    /// Written with this hash; the cache is behind (shows an older version or nothing).
    Pending(String),
    /// Deleted; the cache still shows it.
    Gone,
}

/// Whether a cached `resourceVersion` is at least `written`. Resource versions are opaque to
/// clients; the API server's are etcd revisions (integers), compared as such. Anything else
/// counts as caught up only when equal.
fn caught_up(cached: &str, written: &str) -> bool {
    match (cached.parse::<u64>(), written.parse::<u64>()) {
        (Ok(c), Ok(w)) => c >= w,
        _ => cached == written,
    }
}

/// How to read an object whose cached `resourceVersion` is `cached` (`None`: not in the cache),
/// given what Flotilla last wrote. The second value: whether to keep the memo.
pub fn judge(entry: Option<&Entry>, cached: Option<&str>, now: Instant) -> (Seen, bool) {
    let Some(entry) = entry else { return (Seen::Cache, false) };
    let fresh = now.saturating_duration_since(entry.at) < TTL;
    match (&entry.wrote, cached) {
        (Wrote::Applied { resource_version, .. }, Some(rv)) if caught_up(rv, resource_version) => (Seen::Cache, false),
        (Wrote::Applied { hash, .. }, _) if fresh => (Seen::Pending(hash.clone()), true),
        (Wrote::Deleted, None) => (Seen::Cache, false),
        (Wrote::Deleted, Some(_)) if fresh => (Seen::Gone, true),
        _ => (Seen::Cache, false),
    }
}

/// The memo of one member: what Flotilla wrote and the cache may not show yet.
#[derive(Debug, Default)]
pub struct Memo {
    entries: HashMap<Key, Entry>,
}

impl Memo {
    /// Remembers a write (and forgets those past their TTL that no reconcile looked at since).
    pub fn wrote(&mut self, key: Key, owner: &str, wrote: Wrote, now: Instant) {
        self.entries.retain(|_, e| now.saturating_duration_since(e.at) < TTL);
        self.entries.insert(key, Entry { owner: owner.to_string(), wrote, at: now });
    }

    /// How to read `key` given its cached `resourceVersion`; drops the memo once it is no
    /// longer needed.
    pub fn judge(&mut self, key: &Key, cached: Option<&str>, now: Instant) -> Seen {
        let (seen, keep) = judge(self.entries.get(key), cached, now);
        if !keep {
            self.entries.remove(key);
        }
        seen
    }

    /// Objects of `owner` in `namespace` written (applied) by Flotilla, cached or not.
    pub fn applied_by(&self, namespace: &str, owner: &str) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .entries
            .iter()
            .filter(|(k, e)| k.1 == namespace && e.owner == owner && matches!(e.wrote, Wrote::Applied { .. }))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// How many writes are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        ("Deployment", "ml".into(), "llama-h100".into())
    }

    fn applied(hash: &str, rv: &str) -> Wrote {
        Wrote::Applied { hash: hash.into(), resource_version: rv.into() }
    }

    #[test]
    fn an_apply_counts_as_done_until_the_cache_shows_its_version() {
        let t0 = Instant::now();
        let mut m = Memo::default();
        m.wrote(key(), "ml.llama", applied("h2", "120"), t0);
        // The cache still holds the version before the apply (or nothing, for a new object):
        // the object counts as holding the applied hash, so nothing is written again.
        assert_eq!(m.judge(&key(), Some("100"), t0), Seen::Pending("h2".into()));
        assert_eq!(m.judge(&key(), None, t0), Seen::Pending("h2".into()));
        assert_eq!(m.len(), 1);
        // Caught up: the cache is trusted again (drift shows from here on), the memo goes.
        assert_eq!(m.judge(&key(), Some("120"), t0 + Duration::from_millis(5)), Seen::Cache);
        assert!(m.is_empty());
    }

    #[test]
    fn a_later_version_in_the_cache_is_trusted_it_may_be_a_hand_edit() {
        let t0 = Instant::now();
        let mut m = Memo::default();
        m.wrote(key(), "ml.llama", applied("h2", "120"), t0);
        assert_eq!(m.judge(&key(), Some("121"), t0), Seen::Cache, "someone wrote after Flotilla: drift is judged");
        // Numbers, not text: "99" < "120".
        m.wrote(key(), "ml.llama", applied("h2", "120"), t0);
        assert_eq!(m.judge(&key(), Some("99"), t0), Seen::Pending("h2".into()));
    }

    #[test]
    fn a_delete_hides_the_cached_object_until_it_is_gone() {
        let t0 = Instant::now();
        let mut m = Memo::default();
        m.wrote(key(), "ml.llama", Wrote::Deleted, t0);
        assert_eq!(m.judge(&key(), Some("130"), t0), Seen::Gone, "not deleted twice");
        assert_eq!(m.judge(&key(), None, t0), Seen::Cache);
        assert!(m.is_empty());
    }

    #[test]
    fn an_old_memo_is_dropped_and_the_cache_trusted() {
        let t0 = Instant::now();
        let mut m = Memo::default();
        m.wrote(key(), "ml.llama", applied("h2", "120"), t0);
        assert_eq!(m.judge(&key(), Some("100"), t0 + TTL), Seen::Cache);
        assert!(m.is_empty());
        m.wrote(key(), "ml.llama", Wrote::Deleted, t0);
        assert_eq!(m.judge(&key(), Some("100"), t0 + TTL), Seen::Cache);
        // Memos nobody looked at do not pile up.
        m.wrote(key(), "ml.llama", Wrote::Deleted, t0);
        m.wrote(("Service", "ml".into(), "x".into()), "ml.llama", Wrote::Deleted, t0 + TTL);
        assert_eq!(m.len(), 1);
        // Opaque versions count only when equal.
        assert!(caught_up("abc", "abc") && !caught_up("abd", "abc"));
    }

    #[test]
    fn applied_objects_are_found_by_owner_and_namespace() {
        let t0 = Instant::now();
        let mut m = Memo::default();
        m.wrote(key(), "ml.llama", applied("h", "1"), t0);
        m.wrote(("Service", "ml".into(), "llama".into()), "ml.llama", applied("h", "2"), t0);
        m.wrote(("Service", "ml".into(), "other".into()), "ml.other", applied("h", "3"), t0);
        m.wrote(("Service", "ml".into(), "gone".into()), "ml.llama", Wrote::Deleted, t0);
        let names: Vec<String> = m.applied_by("ml", "ml.llama").into_iter().map(|k| k.2).collect();
        assert_eq!(names, ["llama-h100", "llama"], "by kind, then name");
        assert!(m.applied_by("other", "ml.llama").is_empty());
    }
}
