//! [`Etcd`]: one etcd lease per acquisition (docs/ARCHITECTURE.md).
//!
//! - Renew and release concern one acquisition: the key's fencing token,
//!   holder and etcd lease. A backend value remembers, for its clones too,
//!   the etcd lease of each acquisition it made; another value reads it
//!   from the key.
//! - The keys beside `{prefix}{name}` ([`EtcdKey`]) put the byte `0xff`,
//!   which UTF-8 never uses, after the name, so no lease name's key is one
//!   of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue,
    LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use futures_util::{StreamExt, TryStreamExt};

use crate::backend::push::Push;
use crate::backend::{Acquired, Request, clock_ms};
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

mod keys;
mod watch;

use keys::{EtcdKey, NameKeys, SLOT, SLOTS_END, VALUE};
use watch::{HolderWatch, KeyWatch};

/// Leases as etcd keys attached to etcd leases, with the key's
/// `create_revision` as the fencing token.
///
/// # Calls
///
/// An acquisition puts the key `{prefix}{name}`, whose value is the holder,
/// iff it is absent, on a new etcd lease of the ttl rounded up to whole
/// seconds (the cluster may raise it to its minimum, about 1.5 election
/// timeouts). The ttl asked for stays the holder's local deadline; etcd
/// frees the key when the etcd lease expires, up to the rounding plus its
/// expiry check (every 500 ms) after the ttl. An acquisition
/// takes two round trips (a re-acquire three), a renewal one. Each call
/// fails with [`Error::Timeout`] after the backend's
/// [timeout](Etcd::with_timeout) (default 5 s).
///
/// # Other keys and fencing tokens
///
/// Beside the key, a name may have keys that start with it and the byte
/// `0xff` (never part of a name): `value`, the value published with the
/// lease ([`Election::proclaim`](crate::Election::proclaim)), on the
/// acquisition's etcd lease, so it ends with the lease; and `slot/` and 20
/// digits, the schedule ledger ([`Job::once_per`](crate::Job::once_per)),
/// without an etcd lease, so it outlives release and expiry. Slots are read
/// from this process's clock (etcd has none to offer).
///
/// The fencing token is the key's `create_revision`. Revisions grow with
/// every write, so the tokens of one name grow strictly with each
/// acquisition (by more than one).
///
/// # Waiting and watching
///
/// A backend value and its clones keep one etcd watch over the prefix while
/// they have a waiter or a holder (and 10 s after). Through it a waiter
/// ([`Lease::acquire`](crate::Lease::acquire), an
/// [`Election`](crate::Election), [`Lease::observe`](crate::Lease::observe))
/// learns that a key was deleted (released, expired, revoked) or
/// force-released, or that its published value changed, and a holder that
/// its key was deleted or taken over, about one round trip after it
/// committed. The holder's engine then renews at once, and that renewal
/// decides. While the watch is down, waiters poll and holders renew every
/// `ttl/3`, as they do anyway. A process sees every acquisition and release
/// under its prefix: give each application its own.
///
/// # Faults
///
/// - **A member fails** (crash, restart, partition): the engine retries,
///   through the other endpoints, until the lease's local deadline. A new
///   leader restarts every etcd lease's TTL. Without a majority nothing
///   succeeds: the holder stops at its local deadline, and nobody acquires
///   until a majority is back.
/// - **The etcd lease is revoked** (`etcdctl lease revoke`) or **the key is
///   deleted** (`etcdctl del`): another holder may acquire at once, and the
///   holder learns of it about one round trip later (by the watch, else at
///   its next renewal). Until then both may believe they hold the lease:
///   only the fencing token tells their writes apart.
/// - **A leader is paused and resumes** believing it still leads: it may
///   answer a keep-alive it can no longer honour (etcd before 3.4.28 and
///   3.5.11, issue #15247), and revoke leases that their holders renewed
///   through the new leader (its lessor counts from the last keep-alive
///   *it* saw; still seen on 3.5.16). Either way a revocation, as above;
///   docs/RELIABILITY.md measures it (`leader-pause`).
///
/// # Building
///
/// `etcd-client` compiles etcd's protobuf definitions in its build script,
/// which needs `protoc`: install it (`apt-get install protobuf-compiler`,
/// `brew install protobuf`) or set `PROTOC` to its path.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold::{backend::Etcd, Lease};
///
/// # #[tokio::main] async fn main() -> Result<(), leasehold::Error> {
/// let etcd = Etcd::connect(["http://127.0.0.1:2379", "http://127.0.0.1:22379"])
///     .await?
///     .with_prefix("myapp/lease/")?;
/// let lease = Lease::new(etcd);
/// if let Some(guard) = lease.try_acquire("nightly-report", Duration::from_secs(30)).await? {
///     println!("fencing token {:?}", guard.fencing_token());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    prefix: Arc<str>,
    timeout: Duration,
    /// The etcd lease of each acquisition made through this value (and its
    /// clones).
    leases: Arc<Mutex<EtcdLeases>>,
    /// The watch over the prefix (`watch.rs`), set up for the first waiter
    /// or holder, shared by the clones.
    watch: Arc<OnceLock<Push<KeyWatch>>>,
}

/// The etcd lease of each acquisition, by (name, holder, fencing token).
type EtcdLeases = HashMap<(String, String, u64), Remembered>;

/// The key of an acquisition in [`EtcdLeases`].
fn entry(name: &str, holder: &str, fence: u64) -> (String, String, u64) {
    (name.to_owned(), holder.to_owned(), fence)
}

/// An acquisition's etcd lease.
struct Remembered {
    id: i64,
    /// Its release was sent and has not been confirmed (it failed, or was
    /// cancelled by the engine's limit). Such an acquisition is never
    /// renewed, and an acquisition by the same holder that finds its key
    /// finishes that release first (see [`Etcd::try_acquire`]).
    releasing: bool,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// The key prefix used unless [`with_prefix`](Etcd::with_prefix) sets another.
    pub const DEFAULT_PREFIX: &'static str = "lease/";
    /// The longest key prefix, in bytes.
    pub const MAX_PREFIX_LEN: usize = 64;
    /// How long each call may take unless [`with_timeout`](Etcd::with_timeout) says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The most renewals [`renew_many`](Backend::renew_many) has in flight
    /// at a time.
    pub const RENEW_IN_FLIGHT: usize = 64;

    /// Connect to the etcd cluster at `endpoints` (such as
    /// `["http://127.0.0.1:2379"]`), and only those: the client balances its
    /// requests over them and does not discover other members. Give it
    /// every member, so that it goes on when one fails.
    ///
    /// The connection notices a silent member by HTTP/2 pings (every 5 s,
    /// 2 s to answer), asks for a leader on every request (a member cut off
    /// from the leader refuses at once), and gives up connecting after 5 s.
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`] for an invalid or empty list of endpoints.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
    ) -> Result<Self, Error> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Self::DEFAULT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        Self::connect_with(endpoints, options).await
    }

    /// [`connect`](Etcd::connect) with the client's `options` (credentials,
    /// timeouts, TLS) instead of its defaults.
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`] for an invalid or empty list of endpoints, or when
    /// the client cannot start (an authentication that fails).
    pub async fn connect_with<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        options: ConnectOptions,
    ) -> Result<Self, Error> {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|e| e.as_ref().to_owned())
            .collect();
        Ok(Self::new(Client::connect(&endpoints, Some(options)).await?))
    }

    /// A backend on `client`, with the key prefix `lease/` and a 5 s
    /// timeout per call. The client's own settings (endpoints, timeouts,
    /// authentication) apply.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            prefix: Self::DEFAULT_PREFIX.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            leases: Arc::default(),
            watch: Arc::default(),
        }
    }

    /// Use `prefix` in front of every key (default `lease/`); may be empty.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`] if `prefix` is longer than 64 bytes or
    /// contains `{` or `}` (the rule of every backend with a key prefix, so
    /// that one prefix suits them all).
    pub fn with_prefix(self, prefix: impl Into<String>) -> Result<Self, Error> {
        let prefix: String = prefix.into();
        if prefix.len() > Self::MAX_PREFIX_LEN || prefix.contains(['{', '}']) {
            return Err(Error::InvalidPrefix {
                len: prefix.len(),
                prefix,
            });
        }
        Ok(Self {
            prefix: prefix.into(),
            // A watch over the new prefix.
            watch: Arc::default(),
            ..self
        })
    }

    /// Give every call (all its round trips) at most `timeout` (default 5 s);
    /// a call that takes longer fails with [`Error::Timeout`]. The engine
    /// applies its own, often shorter, limits on top (a renewal gets at most
    /// `ttl/3`).
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self {
            timeout,
            watch: Arc::default(),
            ..self
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The client the backend sends its requests with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The etcd key of the lease `name`: `{prefix}{name}`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), leasehold::Error> {
    /// let etcd = leasehold::backend::Etcd::connect(["http://127.0.0.1:2379"]).await?;
    /// assert_eq!(etcd.key("report"), "lease/report");
    /// # Ok(()) }
    /// ```
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The etcd lease TTL, in seconds, for a lease of `ttl`: rounded up to
    /// whole seconds (the cluster may raise it to its minimum).
    pub fn lease_ttl_secs(ttl: Duration) -> i64 {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
    }

    /// The key `{prefix}{name}` followed by `what` ([`VALUE`], [`SLOT`]...).
    fn beside(&self, name: &str, what: &[u8]) -> Vec<u8> {
        [self.key(name).as_bytes(), what].concat()
    }

    /// The ledger key of `slot` of `name`.
    fn slot_key(&self, name: &str, slot: u64) -> Vec<u8> {
        [self.beside(name, SLOT), format!("{slot:020}").into_bytes()].concat()
    }

    /// A get of the ledger of `name`.
    fn read_ledger(&self, name: &str) -> TxnOp {
        let options = GetOptions::new().with_prefix();
        TxnOp::get(self.beside(name, SLOT), Some(options))
    }

    /// The ops that record `slot` in the ledger of `name`: the slot's key
    /// put, every lower one deleted. The ledger is the highest key left, so
    /// a lower slot recorded late never lowers it.
    fn record(&self, name: &str, slot: u64) -> Vec<TxnOp> {
        let below = DeleteOptions::new().with_range(self.slot_key(name, slot));
        vec![
            TxnOp::delete(self.beside(name, SLOT), Some(below)),
            TxnOp::put(self.slot_key(name, slot), "", None),
        ]
    }

    /// What the key `key` is, if it is one of this backend's: the lease
    /// name (lossily, as etcd keys need not be UTF-8) and which of its keys.
    fn parse(&self, key: &[u8]) -> Option<(String, EtcdKey)> {
        let rest = key.strip_prefix(self.prefix.as_bytes())?;
        let (name, kind) = EtcdKey::split(rest)?;
        Some((String::from_utf8_lossy(name).into_owned(), kind))
    }

    /// What [`inspect`](Backend::inspect) answers for `name`, from its keys.
    async fn info(&self, name: String, keys: NameKeys) -> Result<LeaseInfo, Error> {
        let key = keys.lease.as_ref();
        let id = key.map_or(0, KeyValue::lease);
        let expires_in = if id == 0 {
            None
        } else {
            let mut client = self.client.clone();
            let ttl = client
                .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new()))
                .await?
                .ttl();
            // Whole seconds, rounded down (-1: no such lease): the key
            // stays up to a second longer, so that is what is reported
            // (and a key with less than a second left is still held).
            u64::try_from(ttl)
                .ok()
                .map(|s| Duration::from_secs(s.saturating_add(1)))
        };
        let holder = key.map_or(Vec::new(), |kv| kv.value().to_vec());
        let forced = key.is_some() && holder.is_empty();
        let value = keys.value.filter(|_| !forced && expires_in.is_some());
        let info = LeaseInfo::new(
            name,
            String::from_utf8_lossy(&holder),
            expires_in,
            key.and_then(fence_of),
        );
        Ok(info
            .with_value(value)
            .with_slot(keys.slot)
            .with_forced(forced && expires_in.is_some()))
    }

    /// The watch over the prefix, set up now if it is not.
    fn watch(&self) -> &Push<KeyWatch> {
        self.watch.get_or_init(|| {
            Push::new(KeyWatch {
                client: self.client.clone(),
                prefix: self.prefix.clone(),
                timeout: self.timeout,
                holders: Arc::default(),
            })
        })
    }

    fn leases(&self) -> MutexGuard<'_, EtcdLeases> {
        // Every update is a single insert or remove: a poisoned lock is consistent.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, lease: Acquisition<'_>, id: i64) {
        if let Some(fence) = lease.fencing_token {
            let remembered = Remembered {
                id,
                releasing: false,
            };
            self.leases()
                .insert(entry(lease.name, lease.holder, fence), remembered);
        }
    }

    fn forget(&self, lease: Acquisition<'_>) {
        if let Some(fence) = lease.fencing_token {
            self.leases()
                .remove(&entry(lease.name, lease.holder, fence));
        }
    }

    /// Mark `lease` as being released: never renewed again. The etcd lease
    /// it had, if this value knows it.
    fn releasing(&self, lease: Acquisition<'_>) -> Option<i64> {
        let fence = lease.fencing_token?;
        let mut leases = self.leases();
        let held = leases.get_mut(&entry(lease.name, lease.holder, fence))?;
        held.releasing = true;
        Some(held.id)
    }

    /// Whether the key `kv` of `name` is an acquisition of `holder` through
    /// this value whose release was sent and not confirmed.
    fn unconfirmed_release(&self, name: &str, holder: &str, kv: &KeyValue) -> bool {
        fence_of(kv).is_some_and(|fence| {
            self.leases()
                .get(&entry(name, holder, fence))
                .is_some_and(|held| held.releasing && held.id == kv.lease())
        })
    }

    /// Run `call` within the backend's timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| Error::Timeout {
                operation,
                after: self.timeout,
            })?
    }

    /// Revoke the etcd lease `id` in the background (best effort: an unused
    /// lease expires by itself at its TTL).
    fn revoke_later(&self, id: i64) {
        let mut client = self.client.clone();
        let timeout = self.timeout;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tracing::debug!(id, "etcd: revoking an unused etcd lease");
                let _ = tokio::time::timeout(timeout, client.lease_revoke(id)).await;
            });
        }
    }

    /// The etcd lease of `lease`, if that acquisition is still the key's:
    /// remembered, or read from the key.
    async fn lease_of(&self, lease: Acquisition<'_>) -> Result<Option<i64>, Error> {
        let Some(fence) = lease.fencing_token else {
            return Ok(None);
        };
        let remembered = self
            .leases()
            .get(&entry(lease.name, lease.holder, fence))
            .map(|held| (!held.releasing).then_some(held.id));
        if let Some(id) = remembered {
            return Ok(id);
        }
        let mut client = self.client.clone();
        let kv = client.get(self.key(lease.name), None).await?.take_kvs();
        Ok(kv
            .into_iter()
            .next()
            .filter(|kv| fence_of(kv) == Some(fence) && kv.value() == lease.holder.as_bytes())
            .map(|kv| kv.lease()))
    }

    /// One renewal of the acquisition `lease`, whose etcd lease is `id`: a
    /// keep-alive sent together with a linearizable read of the key, judged
    /// by [`verdict`]. The keep-alive opens a stream of its own, which
    /// etcd-client does with a first keep-alive whose answer it checks (a
    /// TTL of 0 is "lease not found"): one round trip, and no answer of
    /// an earlier renewal, cancelled or failed, can be taken for this one's.
    async fn renew_once(&self, lease: Acquisition<'_>, fence: u64, id: i64) -> Result<bool, Error> {
        let mut keeper = self.client.clone();
        let keep_alive = async {
            match keeper.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        };
        // Polled second by `try_join!`: sent no earlier than the keep-alive.
        // `GetOptions` default: a linearizable read.
        let mut reader = self.client.clone();
        let read = reader.get(self.key(lease.name), None);
        let (alive, mut read) = tokio::try_join!(keep_alive, read)?;
        let key = read.take_kvs().into_iter().next().map(|kv| KeySeen {
            create_revision: kv.create_revision(),
            lease: kv.lease(),
            holder_matches: kv.value() == lease.holder.as_bytes(),
        });
        tracing::debug!(
            lease.name = lease.name,
            fence,
            alive,
            ?key,
            "etcd: renewal answered"
        );
        Ok(verdict(alive, key, fence, id))
    }

    /// Acquire with a new etcd lease: an etcd lease not used in the end is
    /// revoked in the background.
    async fn try_acquire(&self, request: Request<'_>) -> Result<Acquired> {
        let mut client = self.client.clone();
        let granted = client
            .lease_grant(Self::lease_ttl_secs(request.ttl), None)
            .await?
            .id();
        let outcome = self.claim(request, granted).await;
        if !matches!(outcome, Ok(Acquired::Granted(_))) {
            self.revoke_later(granted);
        }
        outcome
    }

    /// Put the holder in the key of the request's name on the etcd lease
    /// `granted`, with the request's value and slot, if the key is free or
    /// already the holder's, and the slot is above the ledger.
    async fn claim(&self, request: Request<'_>, granted: i64) -> Result<Acquired> {
        let (name, holder) = (request.name, request.holder);
        let slot = request.once_per.map(|o| o.slot_at(clock_ms()));
        let mut client = self.client.clone();
        let key = self.key(name);
        // The key as this holder holds it already: an idempotent re-acquire
        // moves it to `granted`.
        let mut held: Option<KeyValue> = None;
        let mut finished_release = false;
        loop {
            let when = match &held {
                None => vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
                Some(kv) => vec![
                    Compare::create_revision(key.clone(), CompareOp::Equal, kv.create_revision()),
                    Compare::value(key.clone(), CompareOp::Equal, holder),
                ],
            };
            let response = client
                .txn(self.claim_txn(request, slot, granted, when))
                .await?;
            let revision = response.header().map(|h| h.revision());
            let succeeded = response.succeeded();
            let mut found = gets(response).into_iter();
            if succeeded {
                // A re-acquire keeps the key's `create_revision`, the
                // fencing token; a new key's is the transaction's revision.
                let fence = positive(match &held {
                    Some(kv) => kv.create_revision(),
                    None => revision.unwrap_or(0),
                })?;
                if let Some(old) = held.filter(|kv| kv.lease() != 0) {
                    // Nothing is attached to the old etcd lease any more.
                    self.revoke_later(old.lease());
                }
                self.remember(Acquisition::new(name, holder, Some(fence)), granted);
                let last = self.keys_of(found.next().into_iter().flatten()).slot;
                let grant = Grant::new(Some(fence));
                return Ok(Acquired::Granted(match slot {
                    Some(slot) => grant.with_slot(slot, last),
                    None => grant,
                }));
            }
            let existing = found.next().and_then(|kvs| kvs.into_iter().next());
            let last = self.keys_of(found.next().into_iter().flatten()).slot;
            if let Some(slot) = slot.filter(|&s| last.is_some_and(|last| s <= last)) {
                return Ok(Acquired::AlreadyRan { slot });
            }
            // Held by another holder, or (a re-acquire) the key changed since
            // it was read (expired, released): nothing is acquired this time.
            let Some(kv) = existing.filter(|kv| held.is_none() && kv.value() == holder.as_bytes())
            else {
                return Ok(Acquired::HeldElsewhere { expires_in: None });
            };
            if finished_release || !self.unconfirmed_release(name, holder, &kv) {
                held = Some(kv);
                continue;
            }
            finished_release = true;
            self.finish_release(name, holder, &kv).await?;
        }
    }

    /// The key `kv` is this holder's earlier acquisition, whose release
    /// was sent and not confirmed (the engine kept the name for a ttl
    /// since; etcd frees a key only at its lease's expiry sweep, later).
    /// That release may still be delivered: finish it (revoke its etcd
    /// lease, which deletes the key), so that [`claim`](Etcd::claim)
    /// acquires afresh, with a new fencing token, rather than re-acquires
    /// it with the old one, which the late release would then end.
    async fn finish_release(&self, name: &str, holder: &str, kv: &KeyValue) -> Result<()> {
        tracing::debug!(id = kv.lease(), "etcd: finishing an unconfirmed release");
        match self.client.clone().lease_revoke(kv.lease()).await {
            Ok(_) => {}
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("lease not found") => {}
            Err(e) => return Err(e.into()),
        }
        self.forget(Acquisition::new(name, holder, fence_of(kv)));
        Ok(())
    }

    /// The transaction of [`claim`](Etcd::claim): if `when` holds and no
    /// slot at or above `slot` is recorded, it puts the holder on the etcd
    /// lease `granted` with the request's value, and records the slot
    /// unless `retry_failed` waits for the run to succeed. It reads the
    /// ledger (then) or the key and the ledger (else).
    fn claim_txn(
        &self,
        request: Request<'_>,
        slot: Option<u64>,
        granted: i64,
        mut when: Vec<Compare>,
    ) -> Txn {
        let (name, key) = (request.name, self.key(request.name));
        let on_lease = PutOptions::new().with_lease(granted);
        let mut then = vec![
            self.read_ledger(name),
            TxnOp::put(key.clone(), request.holder, Some(on_lease)),
            self.value_op(name, request.value, granted),
        ];
        if let (Some(slot), Some(once_per)) = (slot, request.once_per) {
            let at_or_above =
                Compare::create_revision(self.slot_key(name, slot), CompareOp::Equal, 0);
            when.push(at_or_above.with_range(self.beside(name, SLOTS_END)));
            if !once_per.retry_failed {
                then.extend(self.record(name, slot));
            }
        }
        Txn::new()
            .when(when)
            .and_then(then)
            .or_else([TxnOp::get(key, None), self.read_ledger(name)])
    }

    /// The op that sets the value published with `name` on the etcd lease
    /// `id` (`None`: deletes it).
    fn value_op(&self, name: &str, value: Option<&str>, id: i64) -> TxnOp {
        match value {
            Some(value) => TxnOp::put(
                self.beside(name, VALUE),
                value,
                Some(PutOptions::new().with_lease(id)),
            ),
            None => TxnOp::delete(self.beside(name, VALUE), None),
        }
    }

    /// The keys of one name among `kvs`.
    fn keys_of(&self, kvs: impl IntoIterator<Item = KeyValue>) -> NameKeys {
        let mut keys = NameKeys::default();
        for kv in kvs {
            if let Some((_, kind)) = self.parse(kv.key()) {
                keys.add(kind, kv);
            }
        }
        keys
    }

    /// The ops that delete the key of `name` (reading it) and its value.
    fn deletion(&self, name: &str) -> Vec<TxnOp> {
        let read = DeleteOptions::new().with_prev_key();
        vec![
            TxnOp::delete(self.key(name), Some(read)),
            TxnOp::delete(self.beside(name, VALUE), None),
        ]
    }

    /// After a transaction with a [`deletion`](Etcd::deletion): revoke the
    /// deleted key's etcd lease, which has nothing left to keep (a failed
    /// revoke only leaves it to expire). Whether a key was deleted.
    async fn revoke_deleted(&self, response: TxnResponse) -> bool {
        let deleted = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Delete(mut d) => d.take_prev_kvs().into_iter().next(),
            _ => None,
        });
        if let Some(id) = deleted.as_ref().map(KeyValue::lease).filter(|&id| id != 0) {
            tracing::debug!(id, "etcd: deleted a key; revoking its etcd lease");
            let _ = self.client.clone().lease_revoke(id).await;
        }
        deleted.is_some()
    }

    /// Release `lease` and, with `slot`, record it in the ledger whoever
    /// holds the key (one transaction).
    async fn release_with(&self, lease: Acquisition<'_>, slot: Option<u64>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let fence = lease.fencing_token.and_then(|f| i64::try_from(f).ok());
        if fence.is_none() && slot.is_none() {
            return Ok(());
        }
        // Whatever the outcome, this acquisition is not renewed again. It is
        // forgotten once the release is confirmed; until then a new
        // acquisition by the holder finishes it.
        let id = self.releasing(lease);
        self.bounded("release", async {
            let key = self.key(lease.name);
            // Without a fencing token, nothing matches: a value compared
            // with a missing key fails.
            let mut compare = vec![
                Compare::create_revision(key.clone(), CompareOp::Equal, fence.unwrap_or(0)),
                Compare::value(key.clone(), CompareOp::Equal, lease.holder),
            ];
            if let Some(id) = id {
                // Not the same acquisition's key moved to another etcd
                // lease by a re-acquire made meanwhile.
                compare.push(Compare::lease(key.clone(), CompareOp::Equal, id));
            }
            let recorded = slot.map_or(Vec::new(), |slot| self.record(lease.name, slot));
            let mut then = self.deletion(lease.name);
            then.extend(recorded.clone());
            let txn = Txn::new().when(compare).and_then(then).or_else(recorded);
            let response = self.client.clone().txn(txn).await?;
            self.forget(lease);
            self.revoke_deleted(response).await;
            Ok(())
        })
        .await
    }
}

/// The fencing token of the key `kv`: its `create_revision`.
fn fence_of(kv: &KeyValue) -> Option<u64> {
    u64::try_from(kv.create_revision()).ok().filter(|&f| f > 0)
}

/// The key as a renewal's read found it.
#[derive(Debug, Clone, Copy)]
struct KeySeen {
    create_revision: i64,
    /// The etcd lease the key is attached to.
    lease: i64,
    /// Whether its value is the acquisition's holder.
    holder_matches: bool,
}

/// Whether a renewal of the acquisition with fencing token `fence` and etcd
/// lease `id` succeeded, given whether its keep-alive found the etcd lease
/// alive and the key its linearizable read found: lost if etcd reports the
/// etcd lease gone (expired, revoked), or if the key is not this
/// acquisition's (expired, released, deleted by hand, moved to another etcd
/// lease) — that read is the cluster's state after the keep-alive was sent.
fn verdict(alive: bool, key: Option<KeySeen>, fence: u64, id: i64) -> bool {
    alive
        && key.is_some_and(|k| {
            u64::try_from(k.create_revision).ok() == Some(fence)
                && k.lease == id
                && k.holder_matches
        })
}

fn positive(revision: i64) -> Result<u64, Error> {
    u64::try_from(revision)
        .ok()
        .filter(|&r| r > 0)
        .ok_or_else(|| Error::Protocol(format!("etcd answered the revision {revision}")))
}

/// The keys each get of a transaction's answer found, in order.
fn gets(response: TxnResponse) -> Vec<Vec<KeyValue>> {
    let gets = response.op_responses().into_iter();
    gets.filter_map(|r| match r {
        TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
        _ => None,
    })
    .collect()
}

impl Backend for Etcd {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        Ok(self
            .acquire_with(Request::new(name, holder, ttl))
            .await?
            .granted())
    }

    /// The slot's clock is this process's. [`Acquired::HeldElsewhere`] does
    /// not say when the lease expires (that is another request).
    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired> {
        validate::request(&request)?;
        self.bounded("acquire", self.try_acquire(request)).await
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        validate::call(lease.name, lease.holder, ttl)?;
        self.bounded("renew", async {
            let (Some(fence), Some(id)) = (lease.fencing_token, self.lease_of(lease).await?) else {
                return Ok(false);
            };
            let alive = self.renew_once(lease, fence, id).await?;
            if !alive {
                self.forget(lease);
            }
            Ok(alive)
        })
        .await
    }

    /// One [`renew`](Backend::renew) per lease (etcd keeps leases alive one
    /// by one), at most [`Etcd::RENEW_IN_FLIGHT`] at a time, so that each
    /// renewal's time limit runs from when it is sent, not from the start of
    /// a queue of thousands. `Err` (the whole batch is retried) at the first
    /// renewal that fails.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Collected first: a stream over the closure is not `Send` for
        // every lifetime the trait's future must accept.
        let calls: Vec<_> = leases
            .iter()
            .map(|&(lease, ttl)| self.renew(lease, ttl))
            .collect();
        futures_util::stream::iter(calls)
            .buffered(Self::RENEW_IN_FLIGHT)
            .try_collect()
            .await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.release_with(lease, None).await
    }

    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        self.release_with(lease, Some(slot)).await
    }

    // Sets or deletes the value key on the acquisition's etcd lease, iff
    // the key is still the acquisition's (one transaction; a read of the
    // key first if this value did not make the acquisition).
    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        validate::publish(&lease, value)?;
        self.bounded("publish", async {
            let fence = lease.fencing_token.and_then(|f| i64::try_from(f).ok());
            let (Some(fence), Some(id)) = (fence, self.lease_of(lease).await?) else {
                return Ok(false);
            };
            let key = self.key(lease.name);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, fence),
                    Compare::value(key.clone(), CompareOp::Equal, lease.holder),
                    Compare::lease(key, CompareOp::Equal, id),
                ])
                .and_then([self.value_op(lease.name, value, id)]);
            let mut client = self.client.clone();
            Ok(client.txn(txn).await?.succeeded())
        })
        .await
    }

    /// `Ok(None)` when there is neither a key nor a ledger (never acquired, or released or expired without
    /// `once_per`: etcd deletes the key with its lease). A released or
    /// expired name with a ledger has no holder and no fencing token.
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        self.bounded("inspect", async {
            let txn = Txn::new().and_then([
                TxnOp::get(self.key(name), None),
                TxnOp::get(self.beside(name, VALUE), None),
                self.read_ledger(name),
            ]);
            let mut client = self.client.clone();
            let keys = self.keys_of(gets(client.txn(txn).await?).into_iter().flatten());
            if !keys.any() {
                return Ok(None);
            }
            self.info(name.to_owned(), keys).await.map(Some)
        })
        .await
    }

    /// Every lease under the prefix, sorted by name, as
    /// [`inspect`](Backend::inspect) answers each. Names are the keys without
    /// the prefix (a key that is not UTF-8 is shown lossily).
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`], or [`Error::Timeout`] after the backend's timeout.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        self.bounded("list", async {
            let mut client = self.client.clone();
            let everything = GetOptions::new().with_prefix();
            let kvs = client
                .get(self.prefix.as_bytes(), Some(everything))
                .await?
                .take_kvs();
            let mut names = std::collections::BTreeMap::<String, NameKeys>::new();
            for kv in kvs {
                if let Some((name, kind)) = self.parse(kv.key()) {
                    names.entry(name).or_default().add(kind, kv);
                }
            }
            names.retain(|_, keys| keys.any());
            let infos = names.into_iter().map(|(name, keys)| self.info(name, keys));
            futures_util::future::join_all(infos)
                .await
                .into_iter()
                .collect()
        })
        .await
    }

    /// Empties the key's value (no holder) and deletes the published value,
    /// keeping the key's etcd lease: nobody acquires the name until it
    /// expires. The holder learns by the watch. The renewal that learns of
    /// the eviction still extends the etcd lease once, so the delay may
    /// last up to a ttl past the expiry `inspect` reported just before. A key without an
    /// etcd lease, which this backend never writes, is not held (as
    /// [`inspect`](Backend::inspect) says): only
    /// [`force_release_now`](Backend::force_release_now) deletes it.
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`], or [`Error::Timeout`] after the backend's timeout.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        let key = self.key(name);
        // A value compared with a missing key fails.
        let txn = Txn::new()
            .when([
                Compare::value(key.clone(), CompareOp::NotEqual, ""),
                Compare::lease(key.clone(), CompareOp::NotEqual, 0),
            ])
            .and_then([
                TxnOp::put(key, "", Some(PutOptions::new().with_ignore_lease())),
                TxnOp::delete(self.beside(name, VALUE), None),
            ]);
        let mut client = self.client.clone();
        self.bounded("force_release", async {
            Ok(client.txn(txn).await?.succeeded())
        })
        .await
    }

    /// Deletes the key and published value, then revokes the etcd lease.
    /// `Ok(true)` if there was a key (also one kept by
    /// [`force_release`](Backend::force_release)). The evicted holder
    /// learns by the watch (or at its next renewal).
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`], or [`Error::Timeout`] after the backend's timeout.
    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        self.bounded("force_release", async {
            let txn = Txn::new().and_then(self.deletion(name));
            let response = self.client.clone().txn(txn).await?;
            Ok(self.revoke_deleted(response).await)
        })
        .await
    }

    /// See [Waiting and watching](Etcd#waiting-and-watching).
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.watch().released(name.to_owned(), poll)
    }

    /// A change of the key other than this acquisition's put; `None` for an
    /// acquisition this value did not make. See [Waiting and
    /// watching](Etcd#waiting-and-watching).
    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        let fence = lease.fencing_token?;
        let id = self
            .leases()
            .get(&entry(lease.name, lease.holder, fence))
            .filter(|held| !held.releasing)
            .map(|held| held.id)?;
        let watch = self.watch();
        let holder = HolderWatch::new(
            &watch.source().holders,
            lease.name,
            i64::try_from(fence).ok()?,
            id,
        );
        watch.listen();
        Some(holder.ended())
    }
}

#[cfg(test)]
mod tests;
