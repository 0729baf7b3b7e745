//! Tests of the adapter record: placement reserves slots and evicts the least recently used idle
//! adapter under one lock, a running load is joined, in-flight requests pin their adapter, a
//! failed load backs off, and the record follows the engine's own list.

use std::time::Duration;

use super::*;
use crate::member_router::Table;
use crate::member_router::pick::Outstanding;

const AFFINITY: Policy = Policy { affinity: true, saturation: 4.0 };

fn live(endpoints: &[&str], max: usize) -> Live {
    let eps: Vec<(&str, f64)> = endpoints.iter().map(|u| (*u, 1.0)).collect();
    let route = Route::new("base", "ns/r", &eps).with_adapters(&[("a", "/ad/a"), ("b", "/ad/b"), ("c", "/ad/c")], max);
    Live::bind(Table::default().with("ns/r", route), &Outstanding::default())
}

/// Place `adapter` and, if that starts a load, end it with `outcome`; the placement's URL, whether
/// it was a hit, and the victims its load evicted.
fn served(book: &Book, l: &Live, adapter: &str, outcome: Result<(), EngineError>) -> (String, bool, Vec<String>) {
    let p = book.place(l, "ns/r", adapter, &[], AFFINITY, Instant::now()).unwrap();
    let victims = p.job.as_ref().map(|j| j.victims.clone()).unwrap_or_default();
    if let Some(job) = &p.job {
        book.finish(job, &outcome, Instant::now() + Duration::from_secs(5));
    }
    (p.url.to_string(), p.wait.is_none(), victims)
}

#[test]
fn the_first_request_loads_the_next_joins_and_later_ones_hit() {
    let (book, l) = (Book::default(), live(&["http://e1", "http://e2"], 2));
    let first = book.place(&l, "ns/r", "a", &[], AFFINITY, Instant::now()).unwrap();
    let job = first.job.as_ref().expect("the first request starts the load");
    assert_eq!((job.adapter.as_str(), job.path.as_str(), job.victims.len()), ("a", "/ad/a", 0));
    let second = book.place(&l, "ns/r", "a", &[], AFFINITY, Instant::now()).unwrap();
    assert!(second.job.is_none() && second.wait.is_some(), "joins the running load");
    assert_eq!(second.url, first.url, "on the same endpoint, though the other one is idler");
    assert_eq!(book.loaded(first.url), Vec::<String>::new(), "not loaded until the load ends");
    book.finish(job, &Ok(()), Instant::now());
    job.tx.send_replace(Some(Ok(())));
    assert!(second.wait.as_ref().unwrap().borrow().is_some(), "the joiner hears the outcome");
    let (url, hit, _) = served(&book, &l, "a", Ok(()));
    assert_eq!((url.as_str(), hit), (first.url, true));
    assert_eq!(book.loaded(first.url), ["a"]);
}

#[test]
fn a_full_endpoint_evicts_its_least_recently_used_idle_adapter() {
    let (book, l) = (Book::default(), live(&["http://e1"], 2));
    served(&book, &l, "a", Ok(()));
    served(&book, &l, "b", Ok(()));
    served(&book, &l, "a", Ok(())); // a is used again: b is now the least recently used
    let (_, hit, victims) = served(&book, &l, "c", Ok(()));
    assert_eq!((hit, victims), (false, vec!["b".to_string()]));
    assert_eq!(book.loaded("http://e1"), ["a", "c"]);
}

#[test]
fn an_adapter_with_a_request_in_flight_is_never_evicted() {
    let (book, l) = (Book::default(), live(&["http://e1"], 2));
    served(&book, &l, "a", Ok(()));
    served(&book, &l, "b", Ok(()));
    let busy_a = book.place(&l, "ns/r", "a", &[], AFFINITY, Instant::now()).unwrap();
    served(&book, &l, "b", Ok(())); // b more recent, but a is busy
    let p = book.place(&l, "ns/r", "c", &[], AFFINITY, Instant::now()).unwrap();
    assert_eq!(p.job.as_ref().unwrap().victims, ["b"]);
    // Now a is busy and c's load holds the other slot: a fourth adapter finds no room.
    let full = book.place(&l, "ns/r", "b", &[], AFFINITY, Instant::now());
    assert_eq!(full.err(), Some(NoPlace::Full));
    drop(busy_a);
    let p = book.place(&l, "ns/r", "b", &[], AFFINITY, Instant::now()).unwrap();
    assert_eq!(p.job.as_ref().unwrap().victims, ["a"], "idle again: evictable; a loading c is not");
}

#[test]
fn a_failed_load_backs_off_on_that_endpoint_only() {
    let (book, l) = (Book::default(), live(&["http://e1", "http://e2"], 2));
    let refused = EngineError::Refused { url: "http://e1".into(), status: 500, message: "broken".into() };
    let (url, _, _) = served(&book, &l, "a", Err(refused));
    let p = book.place(&l, "ns/r", "a", &[], AFFINITY, Instant::now()).unwrap();
    assert_ne!(p.url, url, "the other endpoint loads it");
    drop(p);
    let one = live(&["http://e1"], 2);
    let (book, now) = (Book::default(), Instant::now());
    let refused = EngineError::Refused { url: "http://e1".into(), status: 500, message: "broken".into() };
    served(&book, &one, "a", Err(refused));
    assert_eq!(book.place(&one, "ns/r", "a", &[], AFFINITY, now).err(), Some(NoPlace::BackingOff));
    assert!(book.place(&one, "ns/r", "b", &[], AFFINITY, now).is_ok(), "other adapters are not held back");
    let later = now + Duration::from_secs(6);
    assert!(book.place(&one, "ns/r", "a", &[], AFFINITY, later).unwrap().job.is_some(), "asked again after");
}

#[test]
fn an_engine_at_its_maximum_is_no_fault_of_the_adapter() {
    let (book, l) = (Book::default(), live(&["http://e1"], 2));
    served(&book, &l, "a", Err(EngineError::Full { url: "http://e1".into(), message: "max".into() }));
    assert!(book.place(&l, "ns/r", "a", &[], AFFINITY, Instant::now()).unwrap().job.is_some());
}

#[test]
fn the_record_follows_the_engines_list_and_leaves_unlisted_adapters_alone() {
    let (book, l) = (Book::default(), live(&["http://e1"], 2));
    served(&book, &l, "a", Ok(()));
    // The engine holds `x` (loaded by someone else) and `b`, and no longer `a`.
    book.adopt("http://e1", &["x".to_string(), "b".to_string()]);
    assert_eq!(book.loaded("http://e1"), ["b", "x"]);
    let p = book.place(&l, "ns/r", "c", &[], AFFINITY, Instant::now()).unwrap();
    assert_eq!(p.job.as_ref().unwrap().victims, ["b"], "x is not the router's to unload");
    drop(p);
    // An endpoint that left the table is forgotten; a 404 forgets one adapter.
    book.forget("http://e1", "x");
    assert_eq!(book.loaded("http://e1"), Vec::<String>::new());
    book.retain(&HashSet::new());
    assert!(book.lock().shelves.is_empty());
}

#[test]
fn tried_endpoints_are_not_placed_on_again() {
    let (book, l) = (Book::default(), live(&["http://e1", "http://e2"], 2));
    let p = book.place(&l, "ns/r", "a", &[0, 1], AFFINITY, Instant::now());
    assert_eq!(p.err(), Some(NoPlace::Exhausted));
    let p = book.place(&l, "ns/r", "a", &[0], AFFINITY, Instant::now()).unwrap();
    assert_eq!((p.index, p.url), (1, "http://e2"));
}
