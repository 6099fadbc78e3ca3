//! The watch of one [`Etcd`](super::Etcd) value: one etcd watch over its
//! key prefix, kept by the task of push.rs. A deleted key, a key emptied by
//! a forced release, and a change of a published value wake the waiters of
//! its name (observers and followers too); a change of a held key other
//! than its holder's own put resolves that holder's `lost` hint. Ledger
//! keys are ignored.
//!
//! One watch over the prefix, not one per key: a watch per key costs a
//! round trip per acquisition and per wait (during which a release goes
//! unseen). It carries writes only, never renewals.
//!
//! A holder's hint is asked once per acquisition, so the watch must not
//! fire for what happened before the acquisition's put (its fencing token),
//! nor miss what happened after it. A subscription starts after the last
//! event seen, or after the oldest held put: events in between are
//! replayed. A holder that registers late (its put's event may come before
//! the grant's answer) finds them among the last [`RECENT`]. Where that
//! cannot be told (history compacted while the watch was down; a watch made
//! from now, after a holder's put), the hint fires at once: the renewal
//! decides, and the lease relies on its renewals from then on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};
use tokio::sync::Notify;

use super::EtcdKey;
use crate::Error;
use crate::backend::push::{Event, Source};

/// How many of the last events are kept for holders that register late.
const RECENT: usize = 256;

/// The [`Source`] of an `Etcd` value's push hub: a watch over `prefix`.
pub(super) struct KeyWatch {
    pub(super) client: Client,
    pub(super) prefix: Arc<str>,
    pub(super) timeout: Duration,
    pub(super) holders: Arc<Mutex<Holders>>,
}

/// A subscription, and the releases of its last answer not yet reported.
pub(super) struct Watching {
    stream: WatchStream,
    prefix: Arc<str>,
    holders: Arc<Mutex<Holders>>,
    released: VecDeque<String>,
}

impl Source for KeyWatch {
    type Subscription = Watching;
    const WHAT: &'static str = "etcd watch";

    async fn subscribe(&self) -> Result<Watching, Error> {
        let start = lock(&self.holders).start();
        let options = WatchOptions::new().with_prefix().with_start_revision(start);
        let mut client = self.client.clone();
        let created = async {
            let mut stream = client.watch(self.prefix.as_bytes(), Some(options)).await?;
            let answer = stream.message().await?;
            Ok::<_, Error>((stream, answer))
        };
        let (stream, answer) =
            tokio::time::timeout(self.timeout, created)
                .await
                .map_err(|_| Error::Timeout {
                    operation: "watch",
                    after: self.timeout,
                })??;
        let compacted = answer.as_ref().map_or(0, |a| a.compact_revision());
        let Some(answer) = answer.filter(|a| a.created() && !a.canceled()) else {
            if compacted > 0 {
                lock(&self.holders).missed(compacted);
            }
            return Err(Error::Protocol("etcd did not create the watch".to_owned()));
        };
        // From `start`, or (0) after the revision it was created at.
        let from = match start {
            0 => answer.header().map_or(0, |h| h.revision()) + 1,
            start => start,
        };
        lock(&self.holders).subscribed(from);
        Ok(Watching {
            stream,
            prefix: self.prefix.clone(),
            holders: self.holders.clone(),
            released: VecDeque::new(),
        })
    }

    async fn next(watching: &mut Watching) -> Event {
        loop {
            if let Some(name) = watching.released.pop_front() {
                return Event::Released(name);
            }
            let answer = match watching.stream.message().await {
                Ok(Some(answer)) => answer,
                Ok(None) => return Event::Lost("etcd closed the watch stream".to_owned()),
                Err(e) => return Event::Lost(Error::from(e).chain().to_string()),
            };
            let mut holders = lock(&watching.holders);
            if answer.canceled() {
                if answer.compact_revision() > 0 {
                    holders.missed(answer.compact_revision());
                }
                return Event::Lost(format!("watch cancelled: {}", answer.cancel_reason()));
            }
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let key = kv.key().strip_prefix(watching.prefix.as_bytes());
                let Some((name, kind)) = key.and_then(EtcdKey::split) else {
                    continue;
                };
                let Ok(name) = std::str::from_utf8(name) else {
                    continue;
                };
                // Deleted, or emptied by a forced release.
                let no_holder = event.event_type() == EventType::Delete || kv.value().is_empty();
                match kind {
                    EtcdKey::Lease => {
                        if no_holder {
                            watching.released.push_back(name.to_owned());
                        }
                        holders.seen(Change {
                            name: name.to_owned(),
                            revision: kv.mod_revision(),
                            create_revision: kv.create_revision(),
                            lease: kv.lease(),
                            no_holder,
                        });
                    }
                    EtcdKey::Value => watching.released.push_back(name.to_owned()),
                    EtcdKey::Slot(_) => {}
                }
            }
        }
    }

    fn busy(&self) -> bool {
        !lock(&self.holders).by_name.is_empty()
    }
}

fn lock(holders: &Mutex<Holders>) -> MutexGuard<'_, Holders> {
    // No update panics halfway.
    holders.lock().unwrap_or_else(|e| e.into_inner())
}

/// The holders that watch their keys, by name, and what the watch saw.
#[derive(Default)]
pub(super) struct Holders {
    by_name: HashMap<String, Vec<Registered>>,
    next_id: u64,
    /// Every event up to this revision went by (or never will).
    dispatched: i64,
    /// The events after `recent_after`, up to `dispatched`.
    recent: VecDeque<Change>,
    recent_after: i64,
}

/// One holder: the revision of its acquisition's put (its fencing token),
/// its etcd lease, and how it is told.
struct Registered {
    id: u64,
    fence: i64,
    lease: i64,
    ended: Arc<Notify>,
}

/// One event of the watch.
struct Change {
    name: String,
    revision: i64,
    create_revision: i64,
    lease: i64,
    /// Deleted, or emptied by a forced release.
    no_holder: bool,
}

impl Change {
    /// Whether it ends (may end) the acquisition put at `fence` on the etcd
    /// lease `lease`: anything after that put but a put of a holder in it
    /// on that lease.
    fn ends(&self, fence: i64, lease: i64) -> bool {
        self.revision > fence
            && (self.no_holder || self.create_revision != fence || self.lease != lease)
    }
}

impl Holders {
    /// Where a subscription starts: 0 (now) without holders; else after the
    /// last event seen, and no later than after the oldest holder's put.
    fn start(&self) -> i64 {
        let oldest = self.by_name.values().flatten().map(|r| r.fence).min();
        oldest.map_or(0, |fence| (fence + 1).max(self.dispatched + 1))
    }

    /// A subscription delivers the events from revision `from` on: any
    /// between the last one seen and `from` never will be, and holders put
    /// before them are told.
    fn subscribed(&mut self, from: i64) {
        if from > self.dispatched + 1 {
            self.forget(from - 1);
            self.tell(|r| r.fence < from - 1);
        }
    }

    /// The history up to `compacted` is gone: every holder may have missed
    /// its key's end.
    fn missed(&mut self, compacted: i64) {
        self.forget(self.dispatched.max(compacted - 1));
        self.tell(|_| true);
    }

    fn forget(&mut self, up_to: i64) {
        self.dispatched = up_to;
        self.recent.clear();
        self.recent_after = up_to;
    }

    fn tell(&self, which: impl Fn(&Registered) -> bool) {
        for registered in self.by_name.values().flatten().filter(|r| which(r)) {
            registered.ended.notify_one();
        }
    }

    /// An event went by: the holders whose acquisition it ends are told.
    fn seen(&mut self, change: Change) {
        for r in self.by_name.get(&change.name).into_iter().flatten() {
            if change.ends(r.fence, r.lease) {
                r.ended.notify_one();
            }
        }
        self.dispatched = self.dispatched.max(change.revision);
        if self.recent.len() == RECENT
            && let Some(oldest) = self.recent.pop_front()
        {
            self.recent_after = oldest.revision;
        }
        self.recent.push_back(change);
    }

    /// Register the holder of `name` put at `fence` on the etcd lease
    /// `lease`; told at once if an event that ends it went by, or may have.
    fn register(&mut self, name: &str, fence: i64, lease: i64) -> (u64, Arc<Notify>) {
        let ended = Arc::new(Notify::new());
        let went_by = |c: &Change| c.name == name && c.ends(fence, lease);
        if fence < self.dispatched && (fence < self.recent_after || self.recent.iter().any(went_by))
        {
            ended.notify_one();
        }
        let id = self.next_id;
        self.next_id += 1;
        let registered = Registered {
            id,
            fence,
            lease,
            ended: ended.clone(),
        };
        self.by_name
            .entry(name.to_owned())
            .or_default()
            .push(registered);
        (id, ended)
    }

    fn unregister(&mut self, name: &str, id: u64) {
        if let Some(registered) = self.by_name.get_mut(name) {
            registered.retain(|r| r.id != id);
            if registered.is_empty() {
                self.by_name.remove(name);
            }
        }
    }
}

/// A holder's registration with the watch, until dropped.
pub(super) struct HolderWatch {
    holders: Arc<Mutex<Holders>>,
    name: String,
    id: u64,
    ended: Arc<Notify>,
}

impl HolderWatch {
    /// Watch the acquisition of `name` put at `fence` on the etcd lease `lease`.
    pub(super) fn new(holders: &Arc<Mutex<Holders>>, name: &str, fence: i64, lease: i64) -> Self {
        let (id, ended) = lock(holders).register(name, fence, lease);
        let holders = holders.clone();
        let name = name.to_owned();
        Self {
            holders,
            name,
            id,
            ended,
        }
    }

    /// Resolves when the watch saw the acquisition end, or may have missed it.
    pub(super) async fn ended(self) {
        self.ended.notified().await;
    }
}

impl Drop for HolderWatch {
    fn drop(&mut self) {
        lock(&self.holders).unregister(&self.name, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event on `name` at `revision`: a put (of the key created at
    /// `created`, on the etcd lease `lease`), or a delete (`created` 0).
    fn saw(h: &mut Holders, name: &str, revision: i64, created: i64, lease: i64) {
        let name = name.to_owned();
        let no_holder = created == 0;
        h.seen(Change {
            name,
            revision,
            create_revision: created,
            lease,
            no_holder,
        });
    }

    /// Whether `ended` was told (consumes the permit).
    fn told(ended: &Notify) -> bool {
        let notified = ended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable()
    }

    #[test]
    fn a_holder_is_told_of_what_ends_its_acquisition_only() {
        let mut h = Holders::default();
        h.subscribed(10);
        let (_, ended) = h.register("job", 12, 7);
        // Before its put, its put, its own re-put, another name: nothing.
        saw(&mut h, "job", 11, 0, 0);
        saw(&mut h, "job", 12, 12, 7);
        saw(&mut h, "job", 13, 12, 7);
        saw(&mut h, "other", 14, 0, 0);
        assert!(!told(&ended));
        saw(&mut h, "job", 15, 12, 8);
        assert!(told(&ended), "moved to another etcd lease");
        let (_, deleted) = h.register("job", 16, 9);
        saw(&mut h, "job", 17, 0, 0);
        assert!(told(&deleted));
        let (_, evicted) = h.register("job", 18, 10);
        h.seen(Change {
            name: "job".to_owned(),
            revision: 19,
            create_revision: 18,
            lease: 10,
            no_holder: true,
        });
        assert!(
            told(&evicted),
            "emptied by a forced release, on its etcd lease"
        );
    }

    #[test]
    fn a_holder_that_registers_late_finds_what_went_by() {
        let mut h = Holders::default();
        h.subscribed(10);
        saw(&mut h, "job", 12, 12, 7);
        saw(&mut h, "job", 13, 0, 0);
        assert!(told(&h.register("job", 12, 7).1), "deleted before");
        saw(&mut h, "next", 20, 20, 5);
        assert!(!told(&h.register("next", 20, 5).1), "only its put");
        for revision in 21..25 + RECENT as i64 {
            saw(&mut h, "busy", revision, revision, 1);
        }
        assert!(told(&h.register("next", 20, 5).1), "more went by than kept");
    }

    #[test]
    fn subscriptions_start_where_the_holders_need_them() {
        let mut h = Holders::default();
        assert_eq!(h.start(), 0, "without holders: from now");
        let (a, _) = h.register("a", 30, 1);
        let (_, b) = h.register("b", 20, 2);
        assert_eq!(h.start(), 21, "after the oldest put");
        h.subscribed(21);
        saw(&mut h, "c", 40, 40, 3);
        assert_eq!(h.start(), 41, "after the last event seen");
        h.missed(50);
        assert!(told(&b), "a compacted history: every holder is told");
        assert_eq!(h.start(), 50);
        h.unregister("a", a);
        assert!(h.by_name.contains_key("b") && !h.by_name.contains_key("a"));
        let mut fresh = Holders::default();
        let (_, late) = fresh.register("d", 60, 4);
        fresh.subscribed(70);
        assert!(told(&late), "a watch from after its put");
    }
}
