//! In-process backend for tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::backend::{Acquired, Request};
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Leases kept in this process's memory, for tests.
///
/// Clones share one table, so several [`Lease`](crate::Lease)s built with
/// [`Lease::with_holder`](crate::Lease::with_holder) on clones of one `Memory`
/// behave like pods sharing a database. Expiry follows tokio's clock, so tests
/// under `#[tokio::test(start_paused = true)]` can jump over a ttl instantly.
/// Fencing tokens count up per name from 1, as in the table backends.
/// Schedule slots ([`Job::once_per`](crate::Job::once_per)) are read from
/// the wall clock at the `Memory`'s creation advanced by tokio's clock, so
/// paused time moves them too.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::{backend::Memory, Lease};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), leasehold::Error> {
/// let db = Memory::new();
/// let pod_a = Lease::with_holder(db.clone(), "pod-a");
/// let pod_b = Lease::with_holder(db.clone(), "pod-b");
///
/// let guard = pod_a.try_acquire("report", Duration::from_secs(30)).await?.expect("free");
/// assert!(pod_b.try_acquire("report", Duration::from_secs(30)).await?.is_none());
/// assert_eq!(db.holder("report").as_deref(), Some("pod-a"));
///
/// // Simulate losing the lease (an operator, a clock jump, a takeover):
/// db.expire("report");
/// guard.token().cancelled().await; // the engine notices at its next renewal
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Memory {
    rows: Arc<Mutex<HashMap<String, Row>>>,
    /// The wall clock and tokio's at creation: the clock of schedule slots.
    created: (SystemTime, Instant),
}

impl Default for Memory {
    fn default() -> Self {
        Self {
            rows: Arc::default(),
            created: (SystemTime::now(), Instant::now()),
        }
    }
}

#[derive(Debug)]
struct Row {
    /// Empty once force-released (a holder is never empty): nobody's, and
    /// nobody may take it before `expires_at`.
    holder: String,
    expires_at: Instant,
    fence: u64,
    /// The last schedule slot claimed (or, with `retry_failed`, run).
    last_slot: Option<u64>,
    /// The value the holder published.
    value: Option<String>,
}

impl Row {
    fn live(&self, now: Instant) -> bool {
        self.expires_at > now
    }

    /// This row records `lease`: same holder, same fencing token.
    fn is(&self, lease: Acquisition<'_>) -> bool {
        self.holder == lease.holder && Some(self.fence) == lease.fencing_token
    }
}

impl Memory {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The holder of an unexpired lease on `name`, if any.
    pub fn holder(&self, name: &str) -> Option<String> {
        let now = Instant::now();
        self.rows()
            .get(name)
            .filter(|r| r.live(now) && !r.holder.is_empty())
            .map(|r| r.holder.clone())
    }

    /// The last fencing token handed out for `name` (0 if never acquired).
    pub fn fence(&self, name: &str) -> u64 {
        self.rows().get(name).map_or(0, |r| r.fence)
    }

    /// Expire the lease on `name` now, whoever holds it, as if its ttl had run
    /// out; the holder's next renewal reports the loss.
    pub fn expire(&self, name: &str) {
        if let Some(row) = self.rows().get_mut(name) {
            row.expires_at = row.expires_at.min(Instant::now());
        }
    }

    /// Milliseconds since the Unix epoch, by this `Memory`'s clock.
    fn clock_ms(&self) -> u64 {
        let (wall, mono) = self.created;
        let now = wall + Instant::now().saturating_duration_since(mono);
        let since = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }

    fn info(name: &str, row: &Row, now: Instant) -> LeaseInfo {
        let expires_in = row.live(now).then(|| row.expires_at - now);
        let value = row.value.clone().filter(|_| row.live(now));
        LeaseInfo::new(name, row.holder.clone(), expires_in, Some(row.fence))
            .with_value(value)
            .with_slot(row.last_slot)
            .with_forced(row.holder.is_empty() && row.live(now))
    }

    fn rows(&self) -> MutexGuard<'_, HashMap<String, Row>> {
        // A panic while holding this lock cannot leave a row half-written, so
        // a poisoned lock is still consistent.
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for Memory {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        Ok(self
            .acquire_with(Request::new(name, holder, ttl))
            .await?
            .granted())
    }

    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired> {
        validate::request(&request)?;
        let Request {
            name,
            holder,
            ttl,
            once_per,
            value,
            ..
        } = request;
        let now = Instant::now();
        let slot = once_per.map(|o| o.slot_at(self.clock_ms()));
        let mut rows = self.rows();
        let row = rows.entry(name.to_owned()).or_insert_with(|| Row {
            holder: holder.to_owned(),
            expires_at: now,
            fence: 0,
            last_slot: None,
            value: None,
        });
        if let Some(slot) = slot
            && row.last_slot.is_some_and(|last| slot <= last)
        {
            return Ok(Acquired::AlreadyRan { slot });
        }
        if row.live(now) && row.holder != holder {
            return Ok(Acquired::HeldElsewhere {
                expires_in: Some(row.expires_at - now),
            });
        }
        if !(row.live(now) && row.holder == holder) {
            row.fence += 1;
            row.holder = holder.to_owned();
        }
        row.expires_at = now + ttl;
        row.value = value.map(str::to_owned);
        let mut grant = Grant::new(Some(row.fence));
        if let (Some(slot), Some(once_per)) = (slot, once_per) {
            grant = grant.with_slot(slot, row.last_slot);
            if !once_per.retry_failed {
                row.last_slot = Some(slot);
            }
        }
        Ok(Acquired::Granted(grant))
    }

    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        if let Some(row) = self.rows().get_mut(lease.name) {
            row.last_slot = Some(row.last_slot.map_or(slot, |last| last.max(slot)));
        }
        self.release(lease).await
    }

    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        validate::publish(&lease, value)?;
        let now = Instant::now();
        match self.rows().get_mut(lease.name) {
            Some(row) if row.live(now) && row.is(lease) => {
                row.value = value.map(str::to_owned);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        validate::call(lease.name, lease.holder, ttl)?;
        let now = Instant::now();
        match self.rows().get_mut(lease.name) {
            Some(row) if row.live(now) && row.is(lease) => {
                row.expires_at = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>> {
        validate::name(name)?;
        let now = Instant::now();
        Ok(self.rows().get(name).map(|row| Self::info(name, row, now)))
    }

    /// Every name ever acquired, by name.
    async fn list(&self) -> Result<Vec<LeaseInfo>> {
        let now = Instant::now();
        let mut leases: Vec<LeaseInfo> = self
            .rows()
            .iter()
            .map(|(name, row)| Self::info(name, row, now))
            .collect();
        leases.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(leases)
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        validate::name(name)?;
        let now = Instant::now();
        match self.rows().get_mut(name) {
            Some(row) if row.live(now) && !row.holder.is_empty() => {
                row.holder.clear();
                row.value = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn force_release_now(&self, name: &str) -> Result<bool> {
        validate::name(name)?;
        let now = Instant::now();
        match self.rows().get_mut(name) {
            Some(row) if row.live(now) => {
                row.expires_at = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let now = Instant::now();
        if let Some(row) = self.rows().get_mut(lease.name)
            && row.live(now)
            && row.is(lease)
        {
            row.expires_at = now;
        }
        Ok(())
    }
}
