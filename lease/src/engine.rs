//! The renewal engine behind one [`Lease`](crate::Lease) and its clones: the
//! registry of the names it holds, their acquisition and release, and (in
//! [`scheduler`]) the one task that renews them all. Timing rules live in
//! [`timing`]. The ground rules (a name's life cycle, quarantine, lock
//! order) are in docs/ARCHITECTURE.md, "A name's life cycle in one `Lease`"
//! and "Lock order".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::backend::DynBackend;
use crate::backend::{Acquired, OncePer, Request};
use crate::drop_guard::DropGuard;
use crate::{Acquisition, Error, Grant};

mod scheduler;
pub(crate) mod timing;

pub(crate) use crate::backend::MAX_BATCH;
use scheduler::Scheduler;
use timing::{Deadline, Stamp, acquire_timeout, release_timeout, renew_period};

/// What a job may set about its acquisition and how its lease ends
/// ([`Job`](crate::Job), an [`Election`](crate::Election)).
#[derive(Debug, Clone, Default)]
pub(crate) struct JobOptions {
    /// A ceiling on renewal ([`Job::max_hold`](crate::Job::max_hold)).
    pub(crate) max_hold: Option<Duration>,
    /// How long before the lease could pass on its token fires
    /// ([`Job::grace`](crate::Job::grace)); `None`: [`timing::default_grace`].
    pub(crate) grace: Option<Duration>,
    /// The schedule slot to claim ([`Job::once_per`](crate::Job::once_per)).
    pub(crate) once_per: Option<OncePer>,
    /// The value to publish with the lease
    /// ([`Election::proclaim`](crate::Election::proclaim)).
    pub(crate) value: Option<Arc<str>>,
}

impl JobOptions {
    /// The grace for a lease of `ttl`, checked ([`Error::InvalidGrace`]).
    pub(crate) fn grace(&self, ttl: Duration) -> Result<Duration, Error> {
        match self.grace {
            Some(grace) => timing::check_grace(ttl, grace).map(|()| grace),
            None => Ok(timing::default_grace(ttl)),
        }
    }
}

/// What one acquisition attempt got: the lease (an engine's entry, or its
/// guard), or another holder has it.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    /// The lease, now held.
    Granted(T),
    /// Another holder has it (or this `Lease` is busy with the name),
    /// until `expires_in` from now if the backend said.
    Held { expires_in: Option<Duration> },
}

/// How long a waiter waits between attempts, jittered (see [`timing::wait_poll`]).
pub(crate) fn wait_poll(ttl: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    // `RandomState` is seeded anew per instance: enough jitter for waiters.
    let spread = RandomState::new().hash_one(ttl) as f64 / u64::MAX as f64;
    timing::wait_poll(ttl, spread)
}

/// A lease held through one [`Lease`](crate::Lease): shared by its guard and
/// the scheduler.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) ttl: Duration,
    /// The grant's fencing token, which renewals and the release carry.
    pub(crate) fencing_token: Option<u64>,
    /// The token fires this long before the lease could pass on when
    /// renewals fail; see [`timing::default_grace`].
    pub(crate) grace: Duration,
    /// Cancelled when the lease is lost or released, or its body is told
    /// to stop (shutdown, `max_hold`).
    pub(crate) cancel: CancellationToken,
    /// Cancelled once nothing more happens to the lease: its release has
    /// been answered (or timed out), or it was left to expire. What
    /// [`Engine::shut_down`] waits for.
    done: CancellationToken,
    pub(crate) acquired_at: Instant,
    /// The schedule slot this acquisition claimed, and how it is recorded
    /// ([`Job::once_per`](crate::Job::once_per)).
    pub(crate) slot: Option<(u64, OncePer)>,
    /// The body succeeded: with `retry_failed`, its release records the slot.
    pub(crate) succeeded: std::sync::atomic::AtomicBool,
    /// `max_hold`: the token is cancelled at this instant, and the lease
    /// winds down (see [`Timing::wind_down_until`]).
    max_hold_until: Option<Instant>,
    timing: Mutex<Timing>,
}

/// Why a lease was lost (the `reason` label of `lease_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The backend says it is no longer ours.
    Taken,
    /// No renewal succeeded before its local deadline (or nothing can renew
    /// it any more).
    Deadline,
    /// Its `max_hold` ran out.
    MaxHold,
}

impl Loss {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Loss::Taken => "taken",
            Loss::Deadline => "deadline",
            Loss::MaxHold => "max_hold",
        }
    }
}

/// Where a held lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    /// Renewed by the scheduler.
    Live,
    /// Lost (definite loss or deadline passed); the token is cancelled.
    Lost,
    /// Stopped by its guard: released or being released.
    Stopped,
}

/// The mutable part of an [`Entry`].
#[derive(Debug)]
struct Timing {
    state: LeaseState,
    /// The token is cancelled when this passes.
    deadline: Deadline,
    next_renew: Instant,
    /// Failed renewals in a row.
    failures: u32,
    /// A renewal of this lease is in flight.
    in_flight: bool,
    /// The backend hinted a loss while a renewal was in flight: renew again
    /// as soon as it answers ([`Engine::renew_now`]).
    recheck: bool,
    /// Release the lease at this instant unless released earlier (`min_hold`).
    release_at: Option<Instant>,
    /// Winding down (after a shutdown or `max_hold`): the token is
    /// cancelled, and the lease is still renewed until this instant (its
    /// grace) for the body to stop; the guard's release ends it as usual.
    /// If the body is still running then, the lease is left to expire
    /// ([`Entry::abandon`]).
    wind_down_until: Option<Instant>,
    /// Left to expire on the server: nothing renews or waits for it.
    abandoned: bool,
}

impl Entry {
    fn timing(&self) -> MutexGuard<'_, Timing> {
        lock(&self.timing)
    }

    /// The acquisition that renewals and the release of this lease concern.
    fn acquisition<'a>(&'a self, holder: &'a str) -> Acquisition<'a> {
        Acquisition::new(&self.name, holder, self.fencing_token)
    }

    /// Valid = not lost, not released, and before the local deadline, by the
    /// clocks now.
    pub(crate) fn is_valid(&self) -> bool {
        let t = self.timing();
        t.state == LeaseState::Live
            && !t.deadline.passed(Stamp::now())
            && !self.cancel.is_cancelled()
    }

    /// Mark the lease lost and tell its holder.
    fn lose(&self, t: &mut Timing, holder: &str, reason: Loss, why: &str) {
        if t.state == LeaseState::Live {
            t.state = LeaseState::Lost;
            self.cancel.cancel();
            crate::metrics::lost(&self.name, reason.label());
            crate::metrics::held(-1.0);
            tracing::warn!(
                lease.name = %self.name,
                holder,
                fencing_token = self.fencing_token,
                reason = reason.label(),
                "lease lost: {why}"
            );
        }
    }

    /// Tell the body to stop and keep the lease (renewed) for it until
    /// `until` at the latest: a shutdown or `max_hold`. A lease
    /// lost or released already is only told.
    fn wind_down(&self, t: &mut Timing, until: Instant) {
        self.cancel.cancel();
        if t.state == LeaseState::Live {
            t.wind_down_until = Some(t.wind_down_until.map_or(until, |at| at.min(until)));
        }
    }

    /// Stop renewing the lease and leave it to expire on the server, its
    /// body (if any) still running: its guard, when it ends, still releases
    /// it (that is safe then). Logged with `why`, once: at warn for a body
    /// still running, at info for a lease kept for its `min_hold`.
    fn abandon(&self, t: &mut Timing, holder: &str, why: &str) {
        if t.abandoned || t.state == LeaseState::Stopped {
            return;
        }
        let min_hold = t.release_at.is_some();
        t.abandoned = true;
        t.wind_down_until = None;
        t.release_at = None;
        if t.state == LeaseState::Live {
            t.state = LeaseState::Lost;
            crate::metrics::held(-1.0);
        }
        self.cancel.cancel();
        self.done.cancel();
        if min_hold {
            tracing::info!(
                lease.name = %self.name,
                holder,
                fencing_token = self.fencing_token,
                "{why}; leaving the lease unreleased and unrenewed, to expire on the server"
            );
        } else {
            tracing::warn!(
                lease.name = %self.name,
                holder,
                fencing_token = self.fencing_token,
                grace = ?self.grace,
                "{why}; leaving the lease unreleased and unrenewed, to expire on the server"
            );
        }
    }

    /// How long it stays valid by the monotonic clock (zero once lost,
    /// released or past its deadline).
    pub(crate) fn valid_for(&self) -> Duration {
        let t = self.timing();
        if t.state != LeaseState::Live || self.cancel.is_cancelled() {
            return Duration::ZERO;
        }
        t.deadline.mono.saturating_duration_since(Instant::now())
    }
}

/// What this engine knows about a name (docs/ARCHITECTURE.md, "A name's life cycle").
#[derive(Debug)]
enum Slot {
    /// Reserved, releasing or quarantined.
    Busy,
    /// Held: renewed by the scheduler.
    Held(Arc<Entry>),
}

/// Everything behind [`Engine::names`].
#[derive(Debug, Default)]
struct Names {
    slots: HashMap<Arc<str>, Slot>,
    /// A scheduler task is running for this engine.
    scheduler: bool,
    /// When the scheduler will wake up next by itself (set under this lock
    /// by each plan): a new lease due no earlier needs no wake-up call, so
    /// acquiring thousands of leases does not re-plan thousands of times.
    planned: Option<Instant>,
    /// Acquisitions in flight ([`Engine::acquire`]), which `shut_down`
    /// waits for, and when the last of them ends by its time limits (the
    /// acquire's, then the release of a grant that came after a shutdown
    /// began); `None` when there are none.
    acquiring: usize,
    acquiring_until: Option<Instant>,
}

/// A name this engine has taken (reserved, or releasing): dropping the
/// claim frees it; [`disarm`](DropGuard::disarm) hands the freeing on.
type Claim = DropGuard<(Arc<Engine>, Arc<str>)>;

/// The claim of an acquisition in progress.
pub(crate) type Reservation = Claim;

/// A release under way in the caller's task ([`Engine::release`]), with the
/// name's claim and when the release was sent: if it is dropped unfinished,
/// the release is sent again in a task of its own, which takes the claim.
type Unfinished = DropGuard<(Claim, Arc<Entry>, Instant)>;

/// The state behind one [`Lease`](crate::Lease) and all its clones.
pub(crate) struct Engine {
    pub(crate) backend: Box<dyn DynBackend>,
    pub(crate) holder: Arc<str>,
    names: Mutex<Names>,
    /// Wakes the scheduler (a new lease due before its planned wake-up, a
    /// `min_hold` to keep, a wind-down, a hint of loss).
    wake: Notify,
    /// Wakes waiters of this `Lease` ([`Engine::freed`]) when a release frees a name.
    freed: Notify,
    /// Wakes [`Engine::shut_down`] when the last acquisition in flight ends.
    acquired: Notify,
    /// [`Engine::shut_down`] was called: nothing is acquired any more.
    closed: std::sync::atomic::AtomicBool,
    /// The runtime the scheduler was last started on: a release asked for
    /// outside any runtime (a guard dropped on a plain thread) is sent there.
    renewing: Mutex<Option<tokio::runtime::Handle>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these locks are held; if something did, the data
    // is still consistent (every update is a single assignment).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    pub(crate) fn new(backend: Box<dyn DynBackend>, holder: Arc<str>) -> Self {
        Self {
            backend,
            holder,
            names: Mutex::new(Names::default()),
            wake: Notify::new(),
            freed: Notify::new(),
            acquired: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            renewing: Mutex::new(None),
        }
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        lock(&self.names)
    }

    /// The claim of a name being released, whose drop frees it and wakes
    /// this `Lease`'s waiters.
    fn claim(self: &Arc<Self>, name: Arc<str>) -> Claim {
        DropGuard::new((self.clone(), name), |(engine, name)| {
            engine.forget(&name);
            engine.freed.notify_waiters();
        })
    }

    /// The leases held now (live: renewed, not lost or released).
    pub(crate) fn held(&self) -> Vec<Arc<Entry>> {
        let names = self.names();
        names
            .slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Held(entry) if entry.timing().state == LeaseState::Live => {
                    Some(entry.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Whether [`shut_down`](Engine::shut_down) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Acquire nothing any more; wait for the acquisitions in flight (a
    /// grant they get now is released, see [`Engine::acquire`]); wind every
    /// held lease down (token cancelled, still renewed for up to its grace,
    /// released by its guard when the body ends) and wait for each to be
    /// released or left to expire ([`Engine::await_body`]); a lease kept for
    /// its `min_hold` is left to expire at once. The scheduler exits once
    /// nothing is left for it.
    pub(crate) async fn shut_down(self: &Arc<Self>) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        // §5.3: when this returns nothing is renewed any more, not even a
        // lease whose grant was on its way when it was called.
        loop {
            let mut ended = std::pin::pin!(self.acquired.notified());
            ended.as_mut().enable();
            let Some(until) = self.names().acquiring_until else {
                break;
            };
            if tokio::time::timeout_at(until, ended).await.is_err() {
                // Only a call its caller stopped polling gets here; it still
                // gives its grant back if one comes.
                tracing::warn!(holder = %self.holder, "shutdown: an acquisition is still in flight after its time limits; not waiting for it");
                break;
            }
        }
        let now = Instant::now();
        let held: Vec<Arc<Entry>> = {
            let names = self.names();
            let held: Vec<Arc<Entry>> = names
                .slots
                .values()
                .filter_map(|slot| match slot {
                    Slot::Held(entry) => Some(entry.clone()),
                    Slot::Busy => None,
                })
                .collect();
            // Under the names lock, as the scheduler's plan: none of them
            // changes state meanwhile (lock order: names, then timing).
            for entry in &held {
                let mut t = entry.timing();
                if t.release_at.is_some() {
                    // Its body is done, and the lease kept for `min_hold`:
                    // releasing it now would let another replica run the
                    // job again within min_hold. It expires within a ttl.
                    entry.abandon(&mut t, &self.holder, "shutdown: kept for its min_hold");
                } else {
                    entry.wind_down(&mut t, now + entry.grace);
                }
            }
            held
        };
        // The scheduler plans the ends of the graces.
        self.wake.notify_one();
        let bodies = held
            .iter()
            .map(|entry| self.await_body(entry, now + entry.grace));
        futures_util::future::join_all(bodies).await;
        self.wake.notify_one();
    }

    /// Tell `entry`'s body to stop and keep the lease (renewed) for it up to
    /// its grace: what a shutdown does to every lease, for one (an
    /// election's resign, §6.1). Its guard releases it when the body ends;
    /// the scheduler leaves it to expire if the body is still running then.
    pub(crate) fn wind_down(&self, entry: &Arc<Entry>) {
        {
            let _names = self.names();
            let mut t = entry.timing();
            entry.wind_down(&mut t, Instant::now() + entry.grace);
        }
        self.wake.notify_one();
    }

    /// Wait until `entry`'s body has ended and its release been answered,
    /// or until `until` (its grace): then a lease whose body still runs is
    /// left to expire, and a release under way is awaited (it has its time
    /// limit, `release_timeout`).
    async fn await_body(self: &Arc<Self>, entry: &Arc<Entry>, until: Instant) {
        if tokio::time::timeout_at(until, entry.done.cancelled())
            .await
            .is_ok()
        {
            return;
        }
        let releasing = {
            let _names = self.names();
            let mut t = entry.timing();
            if t.state == LeaseState::Stopped {
                true
            } else {
                entry.abandon(
                    &mut t,
                    &self.holder,
                    "shutdown: its body is still running at the end of its grace",
                );
                false
            }
        };
        if releasing {
            let limit = release_timeout(entry.ttl);
            let _ = tokio::time::timeout(limit, entry.done.cancelled()).await;
        }
    }

    /// Claim `name` within this `Lease` for an acquisition; `None` if this
    /// `Lease` already holds it or is acquiring or releasing it.
    pub(crate) fn reserve(self: &Arc<Self>, name: &str) -> Option<Reservation> {
        let mut names = self.names();
        if names.slots.contains_key(name) {
            return None;
        }
        let name: Arc<str> = name.into();
        names.slots.insert(name.clone(), Slot::Busy);
        drop(names);
        // An acquisition that got nothing frees the name without waking
        // waiters: nothing was released (a waiter's own failed attempt must
        // not wake it).
        Some(DropGuard::new((self.clone(), name), |(engine, name)| {
            engine.forget(&name);
        }))
    }

    /// Acquire the reserved name through the backend, within its time limit.
    ///
    /// A grant whose reply is handled only after the lease's local deadline
    /// (`tokio::time::timeout` polls the call before its timer: a reply that
    /// sat in the socket while the runtime stalled or the machine slept) is
    /// never handed out: it is released, and the acquisition times out.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        reservation: Reservation,
        ttl: Duration,
        options: &JobOptions,
    ) -> Result<Attempt<Arc<Entry>>, Error> {
        let grace = options.grace(ttl)?;
        // Counted until this call ends, release of a late grant included.
        let Some(_in_flight) = self.start_acquiring(ttl) else {
            return Err(Error::ShutDown);
        };
        // A grant that comes after `ttl - grace` would not be handed out.
        let limit = acquire_timeout(ttl).min(ttl - grace);
        let timed_out = Error::Timeout {
            operation: "acquire",
            after: limit,
        };
        let sent = Stamp::now();
        let name = &*reservation.1;
        let started = std::time::Instant::now();
        let answer = timeout(limit, self.ask(name, ttl, options)).await;
        crate::metrics::backend_seconds("acquire", started.elapsed());
        let grant = match answer {
            Ok(Ok(Acquired::Granted(grant))) => grant,
            Ok(Ok(Acquired::HeldElsewhere { expires_in })) => {
                return Ok(Attempt::Held { expires_in });
            }
            Ok(Ok(Acquired::AlreadyRan { slot })) => {
                return Err(Error::AlreadyRan {
                    name: name.to_owned(),
                    slot,
                });
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(timed_out),
        };
        self.note_missed_slots(name, &grant);
        let entry = self.hold(reservation, ttl, grant, sent, options, grace);
        if self.is_closed() {
            // The grant came after `shutdown` began, which waits for this:
            // give it back, as nothing is acquired after a shutdown (§5.3).
            tracing::debug!(lease.name = %entry.name, holder = %self.holder, "lease granted after shutdown began; releasing it");
            let _ = self.release(&entry).await; // a failure is logged
            return Err(Error::ShutDown);
        }
        if let Some(lost) = self.backend.lost(entry.acquisition(&self.holder)) {
            self.heed(&entry, lost);
        }
        if entry.timing().deadline.passed(Stamp::now()) {
            tracing::warn!(
                lease.name = %entry.name,
                holder = %self.holder,
                fencing_token = entry.fencing_token,
                "lease granted too late to be used: its deadline had passed when the reply was handled; releasing it"
            );
            self.release_in_background(&entry);
            return Err(timed_out);
        }
        Ok(Attempt::Granted(entry))
    }

    /// The backend's answer to an acquisition of `name`: through `acquire`
    /// — what every backend implements, the steady-state path — when the
    /// job asks for nothing more, else through `acquire_with`.
    async fn ask(
        &self,
        name: &str,
        ttl: Duration,
        options: &JobOptions,
    ) -> Result<Acquired, Error> {
        if options.once_per.is_none() && options.value.is_none() {
            let grant = self.backend.acquire(name, &self.holder, ttl).await?;
            return Ok(grant.map_or(
                Acquired::HeldElsewhere { expires_in: None },
                Acquired::Granted,
            ));
        }
        let mut request = Request::new(name, &self.holder, ttl);
        request.once_per = options.once_per;
        request.value = options.value.as_deref();
        self.backend.acquire_with(request).await
    }

    /// Schedule slots between the last one recorded and the one `grant`
    /// claimed were claimed by no run: warned and counted.
    fn note_missed_slots(&self, name: &str, grant: &Grant) {
        if let (Some(slot), Some(last)) = (grant.slot, grant.last_slot)
            && slot > last + 1
        {
            let missed = slot - last - 1;
            crate::metrics::slots_missed(name, missed);
            tracing::warn!(lease.name = name, holder = %self.holder, slot, last_slot = last, missed, "schedule slots were missed: no run claimed them");
        }
    }

    /// Count an acquisition in flight until the returned guard is dropped,
    /// for [`shut_down`](Engine::shut_down) to wait for; `None` once shut
    /// down. The flag is read under the lock that `shut_down` reads the
    /// count under, after setting the flag: an acquisition is either
    /// counted, or sees the flag.
    fn start_acquiring(self: &Arc<Self>, ttl: Duration) -> Option<DropGuard<Arc<Engine>>> {
        let mut names = self.names();
        if self.is_closed() {
            return None;
        }
        names.acquiring += 1;
        let until = Instant::now() + acquire_timeout(ttl) + release_timeout(ttl);
        names.acquiring_until = Some(names.acquiring_until.map_or(until, |at| at.max(until)));
        drop(names);
        Some(DropGuard::new(self.clone(), |engine| {
            let mut names = engine.names();
            names.acquiring -= 1;
            if names.acquiring == 0 {
                names.acquiring_until = None;
                drop(names);
                engine.acquired.notify_waiters();
            }
        }))
    }

    /// Turn a reservation into a held lease and hand it to the scheduler.
    fn hold(
        self: &Arc<Self>,
        reservation: Reservation,
        ttl: Duration,
        grant: Grant,
        sent: Stamp,
        options: &JobOptions,
        grace: Duration,
    ) -> Arc<Entry> {
        let max_hold = options.max_hold;
        let (_, name) = reservation.disarm();
        let next_renew = sent.mono + renew_period(ttl);
        let max_hold_until = max_hold.map(|d| sent.mono + d.min(crate::MAX_TTL));
        // The first thing the scheduler must do for this lease: renew it, or
        // end it at `max_hold` if that comes first.
        let due = max_hold_until.map_or(next_renew, |at| at.min(next_renew));
        let entry = Arc::new(Entry {
            name: name.clone(),
            ttl,
            fencing_token: grant.fencing_token,
            grace,
            cancel: CancellationToken::new(),
            done: CancellationToken::new(),
            acquired_at: sent.mono,
            slot: grant.slot.zip(options.once_per),
            succeeded: std::sync::atomic::AtomicBool::new(false),
            max_hold_until,
            timing: Mutex::new(Timing {
                state: LeaseState::Live,
                deadline: Deadline::after(sent, ttl, grace),
                next_renew,
                failures: 0,
                in_flight: false,
                recheck: false,
                release_at: None,
                wind_down_until: None,
                abandoned: false,
            }),
        });
        crate::metrics::held(1.0);
        let (start, wake) = {
            let mut names = self.names();
            names.slots.insert(name, Slot::Held(entry.clone()));
            let running = std::mem::replace(&mut names.scheduler, true);
            let on_time = names.planned.is_some_and(|at| at <= due);
            (!running, running && !on_time)
        };
        if start {
            let runtime = tokio::runtime::Handle::current();
            *lock(&self.renewing) = Some(runtime.clone());
            runtime.spawn(Scheduler::new(self.clone()).run());
        } else if wake {
            self.wake.notify_one();
        }
        entry
    }

    /// Heed the backend's hint that `entry` may be lost ([`Backend::lost`]):
    /// a task that waits for it, or for the lease to end, and then has the
    /// scheduler renew the lease at once — the renewal decides.
    ///
    /// [`Backend::lost`]: crate::Backend::lost
    fn heed(
        self: &Arc<Self>,
        entry: &Arc<Entry>,
        lost: futures_util::future::BoxFuture<'static, ()>,
    ) {
        let engine = Arc::downgrade(self);
        let watched = entry.clone();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = watched.cancel.cancelled() => {}
                () = lost => {
                    if let Some(engine) = engine.upgrade() {
                        engine.renew_now(&watched);
                    }
                }
            }
        });
    }

    /// Renew `entry` now (a hint of its loss): at once, or as soon as the
    /// renewal in flight answers.
    fn renew_now(&self, entry: &Entry) {
        let mut t = entry.timing();
        if t.state != LeaseState::Live {
            return;
        }
        if t.in_flight {
            t.recheck = true;
            return;
        }
        t.next_renew = Instant::now();
        drop(t);
        tracing::debug!(
            lease.name = %entry.name,
            holder = %self.holder,
            "the backend says the lease may be lost; renewing it now"
        );
        self.wake.notify_one();
    }

    /// Stop renewing `entry` and cancel its token; the name becomes `Busy`
    /// (releasing), owned by the returned claim. `None` if it was already
    /// stopped (someone else is releasing it).
    fn stop(self: &Arc<Self>, entry: &Arc<Entry>) -> Option<Claim> {
        let mut names = self.names();
        {
            let mut t = entry.timing();
            if t.state == LeaseState::Stopped {
                return None;
            }
            if t.state == LeaseState::Live {
                crate::metrics::held(-1.0);
            }
            t.state = LeaseState::Stopped;
        }
        entry.cancel.cancel();
        if let Some(slot) = names.slots.get_mut(&entry.name)
            && matches!(slot, Slot::Held(e) if Arc::ptr_eq(e, entry))
        {
            *slot = Slot::Busy;
        }
        // The scheduler skips a stopped lease by itself, and exits by itself
        // a while after the last one: no need to wake it.
        drop(names);
        Some(self.claim(entry.name.clone()))
    }

    /// Let this `Lease` acquire `name` again (only [`Claim`]s call this).
    fn forget(&self, name: &str) {
        let mut names = self.names();
        if matches!(names.slots.get(name), Some(Slot::Busy)) {
            names.slots.remove(name);
        }
    }

    /// Resolves when this `Lease` next frees a name (any name), or when the
    /// backend says `name` may have been released, or after `poll`: what a
    /// waiter waits for between two attempts. Registers at the call, so a
    /// release between this call and the await is not missed.
    pub(crate) fn freed(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + '_ {
        let mut local = Box::pin(self.freed.notified());
        local.as_mut().enable();
        let remote = self.backend.released(name, poll);
        async move {
            tokio::select! {
                () = local => {}
                () = remote => {}
            }
        }
    }

    /// Stop renewing `entry` and release it here, in the caller's task: no
    /// task is spawned and no other thread woken for the common case. If
    /// this future is dropped before the backend has answered, the release
    /// is sent again in a task of its own (releasing is idempotent), which
    /// frees the name when done. `Ok` if it was already stopped.
    pub(crate) async fn release(self: &Arc<Self>, entry: &Arc<Entry>) -> Result<(), Error> {
        let Some(claim) = self.stop(entry) else {
            return Ok(());
        };
        let sent_at = Instant::now();
        let unfinished: Unfinished =
            DropGuard::new((claim, entry.clone(), sent_at), |(claim, entry, at)| {
                claim.0.clone().spawn_release(claim, entry, Some(at));
            });
        let result = self.send_release(entry).await;
        let (claim, _, _) = unfinished.disarm();
        entry.done.cancel();
        settle(claim, result.is_ok(), sent_at + entry.ttl);
        result
    }

    /// Stop renewing `entry` and release it in a task of its own (on the
    /// current runtime, or else the one that renews), which frees the name
    /// when done. Nothing if it was already stopped; with no runtime left,
    /// the name is freed at once and the lease ends at its ttl.
    pub(crate) fn release_in_background(self: &Arc<Self>, entry: &Arc<Entry>) {
        if let Some(claim) = self.stop(entry) {
            self.spawn_release(claim, entry.clone(), None);
        }
    }

    /// Keep `entry` (renewing it) until `at`, then release it in the
    /// background; the scheduler now owns the release. Returns false, and
    /// changes nothing, if `entry` is no longer live (lost or stopped): the
    /// scheduler may have exited already, so the caller must release it.
    pub(crate) fn release_at(&self, entry: &Arc<Entry>, at: Instant) -> bool {
        {
            // A live entry keeps the scheduler running (it only exits when it
            // finds none), and only the scheduler turns an entry from live to
            // lost, looking at `release_at` under this same lock.
            let mut t = entry.timing();
            if t.state != LeaseState::Live {
                return false;
            }
            if self.is_closed() {
                // A shutdown is winding the lease down: keep `min_hold` by
                // leaving it to expire (see `shut_down`).
                t.release_at = Some(at);
                entry.abandon(&mut t, &self.holder, "shutdown: kept for its min_hold");
                return true;
            }
            if t.wind_down_until.is_some() {
                return false; // `max_hold` ran out: release it now
            }
            t.release_at = Some(at);
        }
        self.wake.notify_one();
        true
    }

    /// The release request of a stopped entry, in a task of its own, which
    /// owns the name's `claim`. With `earlier`, a release was sent before, at
    /// that instant, with unknown fate: the name then stays taken until
    /// `earlier + ttl` whatever the new request's outcome.
    fn spawn_release(self: &Arc<Self>, claim: Claim, entry: Arc<Entry>, earlier: Option<Instant>) {
        let Some(handle) = self.runtime() else {
            tracing::debug!(lease.name = %entry.name, "no tokio runtime to release on; the lease ends at its ttl");
            entry.done.cancel();
            return; // dropping the claim frees the name
        };
        let engine = self.clone();
        drop(handle.spawn(async move {
            // If the runtime shuts down before the answer, dropping the
            // claim frees the name.
            let sent_at = earlier.unwrap_or_else(Instant::now);
            let result = engine.send_release(&entry).await;
            entry.done.cancel();
            let confirmed = result.is_ok() && earlier.is_none();
            settle(claim, confirmed, sent_at + entry.ttl);
        }));
    }

    /// The runtime to spawn on: the current one, or else the one that
    /// renews this engine's leases (a task spawned on a runtime that has
    /// shut down is dropped at once, which frees what it owned).
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| lock(&self.renewing).clone())
    }

    /// Publish `value` with `entry`'s lease ([`Backend::publish`]), within
    /// the release time limit; the outcome is logged (the renewals tell
    /// whether the lease lasts).
    ///
    /// [`Backend::publish`]: crate::Backend::publish
    pub(crate) async fn publish(&self, entry: &Entry, value: Option<&str>) {
        let call = self.backend.publish(entry.acquisition(&self.holder), value);
        match timeout(release_timeout(entry.ttl), call).await {
            Ok(Ok(true)) => {
                tracing::debug!(lease.name = %entry.name, holder = %self.holder, "value published");
            }
            Ok(Ok(false)) => {
                tracing::debug!(lease.name = %entry.name, holder = %self.holder, "value not published: the lease is no longer ours");
            }
            Ok(Err(e)) => {
                tracing::warn!(lease.name = %entry.name, holder = %self.holder, error = %e.chain(), "could not publish the value");
            }
            Err(_) => {
                tracing::warn!(lease.name = %entry.name, holder = %self.holder, "could not publish the value: timed out");
            }
        }
    }

    /// Ask the backend to release `entry`, within the release time limit;
    /// log the outcome.
    async fn send_release(&self, entry: &Entry) -> Result<(), Error> {
        let limit = release_timeout(entry.ttl);
        let lease = entry.acquisition(&self.holder);
        let call = match entry.slot {
            // `retry_failed`: a successful run records its slot as it releases.
            Some((slot, once_per))
                if once_per.retry_failed
                    && entry.succeeded.load(std::sync::atomic::Ordering::Acquire) =>
            {
                self.backend.release_ran(lease, slot)
            }
            _ => self.backend.release(lease),
        };
        let started = std::time::Instant::now();
        let result = timeout(limit, call).await.unwrap_or(Err(Error::Timeout {
            operation: "release",
            after: limit,
        }));
        crate::metrics::backend_seconds("release", started.elapsed());
        match &result {
            Ok(()) => {
                tracing::debug!(lease.name = %entry.name, holder = %self.holder, "lease released");
            }
            Err(e) => tracing::warn!(
                lease.name = %entry.name,
                holder = %self.holder,
                error = %e.chain(),
                "lease release failed; it ends at its ttl"
            ),
        }
        result
    }
}

/// Free the name of `claim` after its release: at once if the backend
/// confirmed it; otherwise not before `until` = when the release was sent +
/// ttl (the quarantine of docs/ARCHITECTURE.md).
fn settle(claim: Claim, confirmed: bool, until: Instant) {
    if confirmed || Instant::now() >= until {
        return; // dropping the claim frees the name
    }
    if let Some(handle) = claim.0.runtime() {
        drop(handle.spawn(async move {
            sleep_until(until).await;
            drop(claim);
        }));
    }
    // No runtime to wait on: the claim is dropped, the name freed now.
}

#[cfg(test)]
mod tests;
