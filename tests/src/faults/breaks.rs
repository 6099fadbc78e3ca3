//! Break switches: deliberately broken behaviour, switched on by the
//! environment variable [`VAR`], to show that each check of the suite can
//! fail. Nothing here is on in a normal run.
//!
//! `LEASE_FAULTS_BREAK` is a comma-separated list of these words; the
//! orchestrator reads it, and the contenders inherit it:
//!
//! | word | who | what is broken | the check that must fail |
//! |---|---|---|---|
//! | `reissue-fence` | contender | each acquisition reports the fencing token of this process's previous acquisition of the name | fences handed out twice; valid holders' writes rejected |
//! | `deadline-1.2` | contender | the holder believes its lease valid until 1.2 ttl after the last successful request was *sent* (instead of ttl − margin) | overlaps (the `latency` and `black-hole` faults) |
//! | `release-ignores-fence` | contender | a release matches name and holder only, as before issue 10 | the `late-release` fault: overlaps, the newer lease lost |
//! | `renew-error-loses` | contender | a renewal that fails (an error, not an answer) is taken for a lost lease | "lease kept" after `conn-kill`, `reset` (run with `--no-pool-ping`, so that a killed connection fails a renewal) |
//! | `announce-before-record` | contender | it announces an acquisition before recording its section, and records it 300 ms late | a `kill` that lands on a section missing from the log |
//! | `ignore-token` | contender | the body ignores its token: it runs to its natural end (or as long as it is held) | overlaps between bodies (`black-hole`, `max-hold`, `drift`) |
//! | `release-at-shutdown` | contender | on `SIGTERM` the lease is ended on the server (by the release of `release-ignores-fence`) before `shutdown()`: a library that released at shutdown without waiting for the body | `deploy`: overlaps between bodies |
//! | `kill-nothing` | nemesis | `conn-kill` kills no connection, `reset` resets none | "the fault did not happen" |
//! | `force-release-now` | nemesis | `force-release` evicts by `Backend::force_release_now` (the immediate kind, for a holder known to be dead) instead of `force_release` (with its lock delay) | `force-release`: overlaps between bodies and between valid holders |
//! | `skip-check-in` | contender | the transactions of `stop-in-txn` are not checked in with the lease (`check_in` skipped) | `stop-in-txn`: stale writes committed to the unfenced table |
//! | `first-variant-only` | nemesis | one injection per fault, always the first variant (as CI did before) | "a documented variant never ran" |
//!
//! The contender's breaks wrap the real backend in `Broken`, which
//! otherwise passes every call through; the library itself is untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::Redis;
use leasehold::{Acquisition, Backend, Error, Grant};

use crate::monotonic_us;

/// The environment variable that switches breaks on.
pub const VAR: &str = "LEASE_FAULTS_BREAK";

/// Is the break `word` switched on (see the [module docs](self))?
pub fn on(word: &str) -> bool {
    std::env::var(VAR).is_ok_and(|v| v.split(',').any(|w| w.trim() == word))
}

/// The breaks switched on, as written in [`VAR`] (empty: none).
pub fn active() -> String {
    std::env::var(VAR).unwrap_or_default()
}

/// Where a release that ignores the fence is sent: the same pool (so the
/// same proxy) as the backend's own statements.
#[derive(Clone)]
pub(crate) enum Raw {
    Pg(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
    Redis(deadpool_redis::Pool, Redis),
    /// No raw release (the Redis Cluster, where `late-release` does not run).
    None,
    Etcd(Box<leasehold::backend::Etcd>),
}

/// What a contender believes about its lease under `deadline-1.2`: valid
/// until 1.2 ttl after the last successful request was sent, unless a
/// renewal said it was lost.
#[derive(Debug, Default)]
pub(crate) struct LateDeadline {
    /// Per name: the believed deadline (µs) and whether the lease was lost.
    leases: Mutex<HashMap<String, (i64, bool)>>,
}

impl LateDeadline {
    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, bool)>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn extend(&self, name: &str, sent: i64, ttl: Duration) {
        let until = sent + i64::try_from((ttl * 6 / 5).as_micros()).unwrap_or(i64::MAX);
        let mut leases = self.leases();
        let entry = leases.entry(name.to_owned()).or_insert((0, false));
        entry.0 = entry.0.max(until);
    }

    /// A new acquisition: forget what the last one believed.
    fn start(&self, name: &str, sent: i64, ttl: Duration) {
        self.leases().remove(name);
        self.extend(name, sent, ttl);
    }

    /// The holder's belief now.
    pub(crate) fn valid(&self, name: &str) -> bool {
        let now = monotonic_us();
        self.leases()
            .get(name)
            .is_some_and(|&(until, lost)| !lost && now < until)
    }
}

/// The real backend, with the contender's breaks applied.
pub(crate) struct Broken<B> {
    inner: B,
    reissue: bool,
    renew_error_loses: bool,
    raw_release: Option<Raw>,
    late_deadline: Option<Arc<LateDeadline>>,
    /// Per name: the real fence of this process's last acquisition
    /// (`reissue-fence`), and the fence reported for the current one.
    fences: Mutex<HashMap<String, (u64, u64)>>,
}

impl<B: Backend> Broken<B> {
    /// `inner` with the breaks of [`VAR`] that apply to a contender;
    /// `raw` is where `release-ignores-fence` sends its statement.
    pub(crate) fn new(inner: B, raw: Raw) -> Self {
        Self {
            inner,
            reissue: on("reissue-fence"),
            renew_error_loses: on("renew-error-loses"),
            raw_release: on("release-ignores-fence").then_some(raw),
            late_deadline: on("deadline-1.2").then(Arc::default),
            fences: Mutex::new(HashMap::new()),
        }
    }

    /// The belief of `deadline-1.2`, if switched on.
    pub(crate) fn late_deadline(&self) -> Option<Arc<LateDeadline>> {
        self.late_deadline.clone()
    }

    fn fences(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.fences.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The real fence of the acquisition the engine knows by `lease`'s.
    fn real(&self, lease: Acquisition<'_>) -> Option<u64> {
        match self.fences().get(lease.name) {
            Some(&(real, reported)) if self.reissue && lease.fencing_token == Some(reported) => {
                Some(real)
            }
            _ => lease.fencing_token,
        }
    }
}

/// The release statements of the table backends and of Redis before issue
/// 10: matched on name and holder, not on the fencing token.
pub(crate) async fn release_ignoring_fence(raw: &Raw, lease: Acquisition<'_>) -> Result<(), Error> {
    let sql = |e: sqlx::Error| Error::Backend(Box::new(e));
    match raw {
        Raw::Pg(pool) => {
            sqlx::query(
                "UPDATE task_leases SET expires_at = TIMESTAMPTZ 'epoch' \
                 WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp()",
            )
            .bind(lease.name)
            .bind(lease.holder)
            .execute(pool)
            .await
            .map_err(sql)?;
        }
        Raw::MySql(pool) => {
            sqlx::query(
                "UPDATE task_leases SET expires_at = '1970-01-01 00:00:01' \
                 WHERE name = ? AND holder = ? AND expires_at > UTC_TIMESTAMP(6)",
            )
            .bind(lease.name.as_bytes())
            .bind(lease.holder.as_bytes())
            .execute(pool)
            .await
            .map_err(sql)?;
        }
        Raw::Redis(pool, backend) => {
            let redis = |e: redis::RedisError| Error::Backend(Box::new(e));
            let mut conn = pool.get().await.map_err(|e| Error::Backend(Box::new(e)))?;
            // The lock's value is `{fence}:{holder}`: compare the holder only.
            redis::Script::new(
                r"
local value = redis.call('GET', KEYS[1])
if value then
  local sep = string.find(value, ':', 1, true)
  if sep and string.sub(value, sep + 1) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
",
            )
            .key(backend.lock_key(lease.name))
            .arg(lease.holder)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(redis)?;
        }
        Raw::None => {
            return Err(Error::Protocol(
                "release-ignores-fence: no raw release on this backend".to_owned(),
            ));
        }
        Raw::Etcd(etcd) => {
            use etcd_client::{Compare, CompareOp, Txn, TxnOp};
            // Delete the key if it holds the holder, whichever acquisition.
            let key = etcd.key(lease.name);
            let txn = Txn::new()
                .when([Compare::value(key.clone(), CompareOp::Equal, lease.holder)])
                .and_then([TxnOp::delete(key, None)]);
            etcd.client()
                .clone()
                .txn(txn)
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
        }
    }
    Ok(())
}

impl<B: Backend> Backend for Broken<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let sent = monotonic_us();
        let grant = self.inner.acquire(name, holder, ttl).await?;
        let Some(grant) = grant else {
            return Ok(None);
        };
        if let Some(late) = &self.late_deadline {
            late.start(name, sent, ttl);
        }
        let Some(real) = grant.fencing_token.filter(|_| self.reissue) else {
            return Ok(Some(grant));
        };
        let mut fences = self.fences();
        // The previous acquisition's fence, handed out again.
        let reported = fences.get(name).map_or(real, |&(previous, _)| previous);
        fences.insert(name.to_owned(), (real, reported));
        Ok(Some(Grant::new(Some(reported))))
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let sent = monotonic_us();
        let real = Acquisition::new(lease.name, lease.holder, self.real(lease));
        let renewed = match self.inner.renew(real, ttl).await {
            Err(_) if self.renew_error_loses => Ok(false),
            other => other,
        };
        if let Some(late) = &self.late_deadline {
            match renewed {
                Ok(true) => late.extend(lease.name, sent, ttl),
                Ok(false) => {
                    if let Some(entry) = late.leases().get_mut(lease.name) {
                        entry.1 = true;
                    }
                }
                Err(_) => {}
            }
        }
        renewed
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        if let Some(late) = &self.late_deadline
            && let Some(entry) = late.leases().get_mut(lease.name)
        {
            entry.1 = true;
        }
        match &self.raw_release {
            Some(raw) => release_ignoring_fence(raw, lease).await,
            None => {
                let real = Acquisition::new(lease.name, lease.holder, self.real(lease));
                self.inner.release(real).await
            }
        }
    }
}
