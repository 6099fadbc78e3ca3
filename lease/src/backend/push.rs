//! Waking waiters when the server pushes a release
//! ([`Backend::released`]): the hub that every built-in backend with push
//! uses, public for a backend of your own.
//!
//! A backend value owns one [`Push`] over its [`Source`] (a server
//! connection subscribed to releases), and its clones share it. Its
//! [`released`](crate::Backend::released) returns
//! [`Push::released`]. The first waiter starts one task, on the waiter's
//! runtime, that keeps one subscription and wakes the waiters of each key a
//! message names. A waiter is registered when [`Push::released`] is
//! *called*, before its future is polled, as `Backend::released` requires.
//!
//! Nothing here decides anything: a wake-up only makes the waiter try to
//! acquire, and every waiter also polls. So a lost message, a connection
//! that is down, or a server that never pushes (a Go replica's release, a
//! holder that crashed) costs at most a poll, never a hang.
//!
//! - **Resubscription.** When the subscription is lost ([`Event::Lost`],
//!   or [`Source::subscribe`] fails), the task subscribes again (after
//!   100 ms, doubling up to 10 s). Every subscription, the first too, wakes
//!   *every* waiter, since releases before it went unseen.
//! - **Lifetime.** The task ends when the [`Push`] is dropped (with the
//!   last clone of the backend), when nobody has waited for 10 s, and when
//!   its runtime shuts down; the next waiter starts it again.
//!
//! # Example
//!
//! A source fed by a broadcast channel, standing in for a server's
//! notifications, and the `released` of a backend that owns the hub:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::Error;
//! use leasehold::backend::push::{Event, Push, Source};
//! use tokio::sync::broadcast;
//!
//! struct Releases(broadcast::Sender<String>);
//!
//! impl Source for Releases {
//!     type Subscription = broadcast::Receiver<String>;
//!     const WHAT: &'static str = "example channel";
//!
//!     async fn subscribe(&self) -> Result<Self::Subscription, Error> {
//!         Ok(self.0.subscribe())
//!     }
//!
//!     async fn next(subscription: &mut Self::Subscription) -> Event {
//!         match subscription.recv().await {
//!             Ok(name) => Event::Released(name),
//!             Err(e) => Event::Lost(e.to_string()),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (tx, _) = broadcast::channel(16);
//! let push = Push::new(Releases(tx.clone()));
//! // In `Backend::released(&self, name, poll)`: `self.push.released(..)`.
//! let poll = Duration::from_secs(60);
//! // The first subscription wakes every waiter: releases before it went
//! // unseen.
//! push.released("job".to_owned(), poll).await;
//! let released = push.released("job".to_owned(), poll);
//! tx.send("job".to_owned()).unwrap(); // the server's notification
//! // Woken by it, long before the poll:
//! let woken = tokio::time::timeout(Duration::from_secs(5), released).await;
//! assert!(woken.is_ok());
//! # }
//! ```
//!
//! [`Backend::released`]: crate::Backend::released

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Error;

#[cfg(feature = "postgres")]
pub(crate) mod pg;

/// How long the subscription is kept after the last waiter is gone.
const LINGER: Duration = Duration::from_secs(10);
/// The first pause before subscribing again after a failure.
const MIN_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to subscribe.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Where releases come from: a server connection subscribed to one channel.
pub trait Source: Send + Sync + 'static {
    /// A subscribed connection.
    type Subscription: Send + 'static;
    /// For logs: `"postgres LISTEN"`, `"redis SUBSCRIBE"`.
    const WHAT: &'static str;

    /// Open a connection and subscribe. An error is logged (at debug) and
    /// the hub tries again later; waiters poll meanwhile.
    fn subscribe(&self) -> impl Future<Output = Result<Self::Subscription, Error>> + Send;

    /// The next thing that happens on `subscription`. Cancel safe: the task
    /// drops it when it stops.
    fn next(subscription: &mut Self::Subscription) -> impl Future<Output = Event> + Send;

    /// The source can never subscribe again (its pool was closed): the task
    /// ends, and no waiter starts it again.
    fn closed(&self) -> bool {
        false
    }

    /// The source has listeners of its own besides the waiters (`Etcd`'s
    /// holders, which watch their keys through the same subscription): the
    /// task does not stop for want of waiters while it has.
    fn busy(&self) -> bool {
        false
    }
}

/// What a subscription reports.
#[derive(Debug)]
pub enum Event {
    /// A release of the lease this key stands for (its name, or a lock key).
    Released(String),
    /// The connection was lost and is subscribed again: messages in between
    /// may be lost: every waiter is woken. (For a subscription that
    /// reconnects by itself, as sqlx's listener does.)
    Resubscribed,
    /// The connection is gone (why): subscribe anew.
    Lost(String),
}

/// The push side of one backend value: dropping it (with the last clone of
/// the backend) stops its task. Share it between the backend's clones (in
/// an `Arc`), so that they keep one subscription.
pub struct Push<S: Source> {
    hub: Arc<Hub<S>>,
}

impl<S: Source> Drop for Push<S> {
    fn drop(&mut self) {
        self.hub.stop.cancel();
    }
}

impl<S: Source> std::fmt::Debug for Push<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.hub.state();
        f.debug_struct("Push")
            .field("source", &S::WHAT)
            .field("listening", &state.task.is_some())
            .field("waited_for", &state.waiters.len())
            .finish()
    }
}

struct Hub<S> {
    source: S,
    /// Cancelled when the [`Push`] is dropped.
    stop: CancellationToken,
    state: Mutex<State>,
}

struct State {
    /// The waiters of each key; an entry lives while some waiter holds it.
    waiters: HashMap<String, Arc<Notify>>,
    /// The id of the task that listens, if one runs (or is starting).
    task: Option<u64>,
    next_task: u64,
    /// When a waiter last registered.
    last_interest: Instant,
}

impl<S: Source> Push<S> {
    /// A hub over `source`. Nothing is subscribed until a waiter comes.
    pub fn new(source: S) -> Self {
        Self {
            hub: Arc::new(Hub {
                source,
                stop: CancellationToken::new(),
                state: Mutex::new(State {
                    waiters: HashMap::new(),
                    task: None,
                    next_task: 0,
                    last_interest: Instant::now(),
                }),
            }),
        }
    }

    /// The source, for what it keeps besides the waiters.
    pub fn source(&self) -> &S {
        &self.hub.source
    }

    /// Start the listening task if none runs, for the source's own
    /// listeners ([`Source::busy`]). Needs a tokio runtime: without one,
    /// nothing starts.
    pub fn listen(&self) {
        Hub::ensure_task(&self.hub);
    }

    /// Resolves when a release of `key` is pushed, when the subscription
    /// was (re-)established (releases may have gone unseen), or after
    /// `poll`. Registers now, and starts the listening task if none runs
    /// (on the current tokio runtime; without one, it only waits `poll`).
    pub fn released(
        &self,
        key: String,
        poll: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut interest = Hub::register(&self.hub, key);
        let sleep = tokio::time::sleep(poll);
        async move {
            tokio::select! {
                () = interest.wait() => {}
                () = sleep => {}
            }
        }
    }
}

impl<S: Source> Hub<S> {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a few assignments that cannot panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(this: &Arc<Self>, key: String) -> Interest<S> {
        let mut state = this.state();
        let notify = state.waiters.entry(key.clone()).or_default().clone();
        // Receives `notify_waiters` from now on, polled or not.
        let notified = Box::pin(notify.notified_owned());
        drop(state);
        Self::ensure_task(this);
        Interest {
            hub: this.clone(),
            key,
            notified: Some(notified),
        }
    }

    /// Note an interest now, and start the listening task if none runs.
    fn ensure_task(this: &Arc<Self>) {
        let mut state = this.state();
        state.last_interest = Instant::now();
        let start = (state.task.is_none() && !this.stop.is_cancelled() && !this.source.closed())
            .then(|| {
                let id = state.next_task;
                state.next_task += 1;
                state.task = Some(id);
                id
            });
        drop(state);
        if let Some(id) = start {
            Self::start(this, id);
        }
    }

    /// Spawn the listening task `id` on the current runtime. Under no lock:
    /// a runtime that is shutting down drops the task inside `spawn`, and
    /// its guard takes the lock.
    fn start(this: &Arc<Self>, id: u64) {
        let running = Running {
            hub: this.clone(),
            id,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(listen(running))),
            // No runtime: nothing listens; the waiters poll (and the
            // guard's drop lets the next waiter start it).
            Err(_) => drop(running),
        }
    }

    /// Wake the waiters of `key`.
    fn wake(&self, key: &str) {
        if let Some(notify) = self.state().waiters.get(key) {
            notify.notify_waiters();
        }
    }

    /// Wake every waiter: releases may have gone unseen.
    fn wake_all(&self) {
        for notify in self.state().waiters.values() {
            notify.notify_waiters();
        }
    }

    /// Nobody has waited for [`LINGER`]: the task `id` stops (decided under
    /// the lock, so that a waiter registering now starts a new one).
    fn idle(&self, id: u64) -> bool {
        let mut state = self.state();
        if state.waiters.is_empty()
            && !self.source.busy()
            && state.last_interest.elapsed() >= LINGER
        {
            if state.task == Some(id) {
                state.task = None;
            }
            return true;
        }
        false
    }
}

/// One waiter's registration for a key: dropping it removes the key's entry
/// when it was the last.
struct Interest<S: Source> {
    hub: Arc<Hub<S>>,
    key: String,
    notified: Option<Pin<Box<OwnedNotified>>>,
}

impl<S: Source> Interest<S> {
    async fn wait(&mut self) {
        match self.notified.as_mut() {
            Some(notified) => notified.as_mut().await,
            None => std::future::pending().await,
        }
    }
}

impl<S: Source> Drop for Interest<S> {
    fn drop(&mut self) {
        // First our reference to the `Notify`: the last interest in a key
        // then finds the map's the only one left. (References are only
        // added under the lock, so the count seen under it cannot be
        // raised behind our back.)
        drop(self.notified.take());
        let mut state = self.hub.state();
        if state
            .waiters
            .get(&self.key)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            state.waiters.remove(&self.key);
        }
    }
}

/// The listening task's hold on its hub: when the task ends, however
/// (returned, or dropped with its runtime), the next waiter may start
/// another.
struct Running<S: Source> {
    hub: Arc<Hub<S>>,
    id: u64,
}

impl<S: Source> Drop for Running<S> {
    fn drop(&mut self) {
        let mut state = self.hub.state();
        if state.task == Some(self.id) {
            state.task = None;
        }
    }
}

/// The listening task: subscribe, dispatch, subscribe again after a
/// failure; until the backend is dropped, nobody has waited for a while, or
/// the source is closed.
async fn listen<S: Source>(running: Running<S>) {
    let hub = &running.hub;
    let mut pause = MIN_PAUSE;
    loop {
        if hub.idle(running.id) || hub.source.closed() {
            return;
        }
        let subscribed = tokio::select! {
            () = hub.stop.cancelled() => return,
            subscribed = hub.source.subscribe() => subscribed,
        };
        let mut subscription = match subscribed {
            Ok(subscription) => subscription,
            Err(e) => {
                tracing::debug!(
                    source = S::WHAT,
                    error = %e.chain(),
                    retry_in = ?pause,
                    "cannot subscribe to releases; waiters poll meanwhile"
                );
                tokio::select! {
                    () = hub.stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
        };
        pause = MIN_PAUSE;
        tracing::debug!(source = S::WHAT, "subscribed to releases");
        // Anything released before now went unseen.
        hub.wake_all();
        let idle_check = tokio::time::sleep(LINGER);
        tokio::pin!(idle_check);
        loop {
            let event = tokio::select! {
                () = hub.stop.cancelled() => return,
                () = &mut idle_check => {
                    if hub.idle(running.id) {
                        return;
                    }
                    idle_check.as_mut().reset(Instant::now() + LINGER);
                    continue;
                }
                event = S::next(&mut subscription) => event,
            };
            match event {
                Event::Released(key) => hub.wake(&key),
                Event::Resubscribed => {
                    tracing::debug!(source = S::WHAT, "subscription re-established");
                    hub.wake_all();
                }
                Event::Lost(why) => {
                    tracing::debug!(
                        source = S::WHAT,
                        why,
                        "subscription to releases lost; subscribing again, waiters poll meanwhile"
                    );
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio::sync::mpsc;

    use super::*;

    /// A source whose subscriptions are channels the test feeds.
    struct Fake {
        subscribes: Arc<AtomicUsize>,
        feed: Arc<Mutex<Option<mpsc::UnboundedReceiver<Event>>>>,
        busy: Arc<AtomicBool>,
    }

    impl Source for Fake {
        type Subscription = mpsc::UnboundedReceiver<Event>;
        const WHAT: &'static str = "fake";

        async fn subscribe(&self) -> Result<Self::Subscription, Error> {
            self.subscribes.fetch_add(1, Ordering::SeqCst);
            let rx = self.feed.lock().expect("lock").take();
            rx.ok_or(Error::Unsupported {
                operation: "subscribe",
            })
        }

        async fn next(rx: &mut Self::Subscription) -> Event {
            rx.recv()
                .await
                .unwrap_or_else(|| Event::Lost("closed".to_owned()))
        }

        fn busy(&self) -> bool {
            self.busy.load(Ordering::SeqCst)
        }
    }

    fn fake() -> (Push<Fake>, mpsc::UnboundedSender<Event>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let subscribes = Arc::new(AtomicUsize::new(0));
        let push = Push::new(Fake {
            subscribes: subscribes.clone(),
            feed: Arc::new(Mutex::new(Some(rx))),
            busy: Arc::default(),
        });
        (push, tx, subscribes)
    }

    const POLL: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_message_wakes_the_waiters_of_its_key_only() {
        let (push, tx, _) = fake();
        // The first subscription wakes everyone once.
        push.released("a".to_owned(), POLL).await;
        let start = Instant::now();
        let a = tokio::spawn(push.released("a".to_owned(), POLL));
        let b = tokio::spawn(push.released("b".to_owned(), POLL));
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send(Event::Released("a".to_owned())).expect("send");
        a.await.expect("a");
        assert!(start.elapsed() < POLL / 2, "{:?}", start.elapsed());
        b.await.expect("b");
        assert!(start.elapsed() >= POLL, "b polls: {:?}", start.elapsed());
        assert!(push.hub.state().waiters.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn registration_happens_at_the_call() {
        let (push, tx, _) = fake();
        push.released("a".to_owned(), POLL).await;
        let start = Instant::now();
        // Called, not yet polled, when the message arrives.
        let waiting = push.released("a".to_owned(), POLL);
        tx.send(Event::Released("a".to_owned())).expect("send");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waiting.await;
        assert!(start.elapsed() < POLL / 2, "{:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_subscription_is_replaced_and_wakes_everyone() {
        let (push, tx, subscribes) = fake();
        push.released("a".to_owned(), POLL).await;
        assert_eq!(subscribes.load(Ordering::SeqCst), 1);
        let (tx2, rx2) = mpsc::unbounded_channel();
        let start = Instant::now();
        let waiting = tokio::spawn(push.released("a".to_owned(), POLL));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Lost; the next subscription fails once, then works.
        tx.send(Event::Lost("killed".to_owned())).expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(subscribes.load(Ordering::SeqCst), 2);
        *push.hub.source.feed.lock().expect("lock") = Some(rx2);
        waiting.await.expect("woken");
        assert_eq!(subscribes.load(Ordering::SeqCst), 3);
        // Woken by the new subscription (after the 100 ms pause), not the poll.
        assert!(start.elapsed() < POLL / 2, "{:?}", start.elapsed());
        let start = Instant::now();
        let waiting = tokio::spawn(push.released("b".to_owned(), POLL));
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx2.send(Event::Released("b".to_owned())).expect("send");
        waiting.await.expect("woken");
        assert!(start.elapsed() < POLL / 2, "{:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_stops_when_idle_and_when_dropped() {
        let (push, _tx, subscribes) = fake();
        push.released("a".to_owned(), POLL).await;
        assert!(push.hub.state().task.is_some());
        tokio::time::sleep(LINGER * 2 + Duration::from_secs(1)).await;
        assert!(push.hub.state().task.is_none(), "stopped when idle");
        // The next waiter starts it again (this fake cannot subscribe twice,
        // so it keeps trying, with growing pauses, and the waiter polls).
        let start = Instant::now();
        push.released("a".to_owned(), POLL).await;
        assert!(start.elapsed() >= POLL);
        assert!(subscribes.load(Ordering::SeqCst) > 1);
        let hub = Arc::downgrade(&push.hub);
        drop(push);
        tokio::time::sleep(MAX_PAUSE * 2).await;
        assert!(
            hub.upgrade().is_none(),
            "the task ended and let go of the hub"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_source_keeps_its_task_without_waiters() {
        let (push, _tx, subscribes) = fake();
        push.source().busy.store(true, Ordering::SeqCst);
        push.listen();
        tokio::time::sleep(LINGER * 3).await;
        assert!(push.hub.state().task.is_some(), "kept while busy");
        assert_eq!(subscribes.load(Ordering::SeqCst), 1);
        push.source().busy.store(false, Ordering::SeqCst);
        tokio::time::sleep(LINGER * 2 + Duration::from_secs(1)).await;
        assert!(push.hub.state().task.is_none(), "stopped once idle");
    }
}
