//! The two ways a [`Redis`](super::Redis) writes its locks, chosen once
//! when it is built: the default, fenced one, and the Go `lock` package's
//! ([`Redis::with_go_locker_protocol`](super::Redis::with_go_locker_protocol)).
//! Everything that differs between them is here; the backend asks.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::redis::ScriptInvocation;

use super::scripts::SCRIPTS;
use crate::backend::{Acquired, Request};
use crate::{Acquisition, Error, Grant, LeaseInfo};

/// The answer of the inspect script: the lock's value, its `PTTL`, the
/// fence counter, the ledger, the value key.
pub(super) type RedisInspectAnswer = (
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
);

#[derive(Clone)]
pub(super) enum LockProtocol {
    /// The lock `{prefix}{{esc(name)}}` holds `{fence}:{holder}`, beside
    /// the fence counter `{lock}:fence`.
    Fenced,
    /// The lock `{prefix}{name}` holds a random token per acquisition, which
    /// only this backend value (and its clones) knows: the Go locker has no
    /// fencing token, and renewals and releases come without one.
    GoLocker(GoTokens),
}

/// The token of each live acquisition, by (name, holder), shared by clones.
/// Every update is one insert or remove: a poisoned lock is consistent.
#[derive(Clone, Default)]
pub(super) struct GoTokens(Arc<Mutex<HashMap<(String, String), String>>>);

impl GoTokens {
    fn forget(&self, lease: Acquisition<'_>, value: &str) {
        let mut tokens = self.lock();
        let key = key(lease.name, lease.holder);
        if tokens.get(&key).is_some_and(|t| t == value) {
            tokens.remove(&key);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LockProtocol {
    pub(super) fn lock_key(&self, prefix: &str, name: &str) -> String {
        if let Self::GoLocker(_) = self {
            return format!("{prefix}{name}");
        }
        // `%`, `{` and `}` percent-encoded: the braces then delimit the hash
        // tag, and every name has keys of its own.
        let mut key = String::with_capacity(prefix.len() + name.len() + 2);
        key.push_str(prefix);
        key.push('{');
        for c in name.chars() {
            match c {
                '%' => key.push_str("%25"),
                '{' => key.push_str("%7B"),
                '}' => key.push_str("%7D"),
                c => key.push(c),
            }
        }
        key.push('}');
        key
    }

    /// The fenced layout's acquire script for `request` on the lock
    /// `lock_key` (see `scripts.rs`).
    pub(super) fn fenced_acquire_call(
        lock_key: &str,
        request: &Request<'_>,
        ttl_ms: u32,
    ) -> ScriptInvocation<'static> {
        let mut call = SCRIPTS.acquire.key(lock_key);
        call.key(format!("{lock_key}:fence"))
            .key(format!("{lock_key}:slot"))
            .key(format!("{lock_key}:value"))
            .arg(request.holder)
            .arg(ttl_ms);
        match request.once_per {
            Some(once_per) => call
                .arg(once_per.period_ms())
                .arg(if once_per.retry_failed { "0" } else { "1" }),
            None => call.arg("0").arg("0"),
        };
        match request.value {
            Some(value) => call.arg("1").arg(value),
            None => call.arg("0").arg(""),
        };
        call
    }

    /// What the fenced acquire script's answer means.
    pub(super) fn fenced_acquired(answer: &[i64]) -> Result<Acquired, Error> {
        let some = |n: i64| u64::try_from(n).ok();
        match *answer {
            [1, fence, slot, last] if fence > 0 => {
                let grant = Grant::new(some(fence));
                Ok(Acquired::Granted(match some(slot) {
                    Some(slot) => grant.with_slot(slot, some(last)),
                    None => grant,
                }))
            }
            [0, pttl] => Ok(Acquired::HeldElsewhere {
                expires_in: some(pttl).filter(|&ms| ms > 0).map(Duration::from_millis),
            }),
            [2, slot] if slot >= 0 => Ok(Acquired::AlreadyRan {
                slot: slot.unsigned_abs(),
            }),
            _ => Err(Error::Protocol(format!(
                "the acquire script answered {answer:?}"
            ))),
        }
    }

    /// Acquire `name` for `holder` in the Go locker's protocol: the
    /// acquire script, sent by `send`, and what its answer means.
    pub(super) async fn go_acquire<F, Fut>(
        tokens: &GoTokens,
        lock_key: String,
        name: &str,
        holder: &str,
        ttl_ms: u32,
        send: F,
    ) -> Result<Option<Grant>, Error>
    where
        F: FnOnce(ScriptInvocation<'static>) -> Fut,
        Fut: Future<Output = Result<i64, Error>>,
    {
        let current = tokens.lock().get(&key(name, holder)).cloned();
        let token = new_token();
        let mut call = SCRIPTS.go_acquire.key(lock_key);
        call.arg(current.as_deref().unwrap_or(""))
            .arg(&token)
            .arg(ttl_ms);
        if send(call).await? == 1 {
            tokens.lock().insert(key(name, holder), token);
            return Ok(Some(Grant::new(None)));
        }
        // Refused: our earlier acquisition of it, if any, is over.
        if let Some(current) = current {
            tokens.forget(Acquisition::new(name, holder, None), &current);
        }
        Ok(None)
    }

    /// The lock's value while `lease` holds it; `None` when it cannot be
    /// ours (no fencing token, or no token of this backend value).
    pub(super) fn lock_value(&self, lease: Acquisition<'_>) -> Option<String> {
        match self {
            Self::Fenced => Some(format!("{}:{}", lease.fencing_token?, lease.holder)),
            Self::GoLocker(tokens) => tokens.lock().get(&key(lease.name, lease.holder)).cloned(),
        }
    }

    /// `lease`, whose lock value was `value`, is over: forget its token
    /// unless a newer acquisition replaced it.
    pub(super) fn forget(&self, lease: Acquisition<'_>, value: &str) {
        if let Self::GoLocker(tokens) = self {
            tokens.forget(lease, value);
        }
    }

    /// The inspect script for the lock `lock_key`.
    pub(super) fn inspect_call(&self, lock_key: String) -> ScriptInvocation<'static> {
        let mut call = SCRIPTS.inspect.key(&lock_key);
        if let Self::Fenced = self {
            call.key(format!("{lock_key}:fence"))
                .key(format!("{lock_key}:slot"))
                .key(lock_key + ":value");
        }
        call
    }

    /// What the inspect script's answer says about `name`.
    pub(super) fn lease_info(&self, name: &str, answer: &RedisInspectAnswer) -> Option<LeaseInfo> {
        let (value, pttl, counter, ledger, published) = answer;
        let expires_in = match *pttl {
            ms if ms > 0 => Some(Duration::from_millis(ms.unsigned_abs())),
            // A lock without expiry (not one of ours): held until deleted.
            -1 => Some(Duration::MAX),
            _ => None,
        };
        let slot = ledger.as_deref().and_then(|s| s.parse::<u64>().ok());
        match (self, value) {
            (Self::Fenced, Some(value)) => {
                let (fence, holder) = match value.split_once(':') {
                    Some((fence, holder)) => (fence.parse::<u64>().ok(), holder),
                    None => (None, value.as_str()),
                };
                // The value of this acquisition only: `{fence}:{value}`.
                let published = published
                    .as_deref()
                    .and_then(|p| p.split_once(':'))
                    .filter(|(f, _)| fence.is_some_and(|fence| f.parse() == Ok(fence)))
                    .map(|(_, v)| v.to_owned());
                let forced = holder.is_empty();
                Some(
                    LeaseInfo::new(name, holder, expires_in, fence)
                        .with_value(published.filter(|_| !forced && expires_in.is_some()))
                        .with_slot(slot)
                        .with_forced(forced && expires_in.is_some()),
                )
            }
            // Released or expired: only the fence key (and the ledger) are left.
            (Self::Fenced, None) => (counter.is_some() || slot.is_some()).then(|| {
                let fence = counter.as_deref().and_then(|c| c.parse::<u64>().ok());
                LeaseInfo::new(name, "", None, fence.filter(|&f| f > 0)).with_slot(slot)
            }),
            (Self::GoLocker(tokens), Some(token)) => {
                let holder = tokens
                    .lock()
                    .iter()
                    .find(|((n, _), t)| n == name && *t == token)
                    .map(|((_, holder), _)| holder.clone())
                    .unwrap_or_default();
                // An empty lock was force-released (`scripts.rs`).
                let forced = token.is_empty() && expires_in.is_some();
                Some(LeaseInfo::new(name, holder, expires_in, None).with_forced(forced))
            }
            (Self::GoLocker(_), None) => None,
        }
    }

    /// The `SCAN` `MATCH` pattern of the keys under `prefix`.
    pub(super) fn scan_pattern(&self, prefix: &str) -> String {
        let mut pattern = String::with_capacity(prefix.len() + 2);
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(match self {
            Self::Fenced => "{*",
            Self::GoLocker(_) => "*",
        });
        pattern
    }

    /// The lease name of a key found under `prefix`, if it is one this
    /// protocol writes: a lock, fence, ledger or value key (fenced), any
    /// key (Go locker).
    pub(super) fn name_of_key(&self, prefix: &str, key: &[u8]) -> Option<String> {
        let rest = std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?).ok()?;
        if let Self::GoLocker(_) = self {
            return (!rest.is_empty()).then(|| rest.to_owned());
        }
        let (escaped, tail) = rest.strip_prefix('{')?.split_once('}')?;
        let ours = ["", ":fence", ":slot", ":value"];
        if !ours.contains(&tail) || escaped.is_empty() {
            return None;
        }
        let name = escaped
            .replace("%7D", "}")
            .replace("%7B", "{")
            .replace("%25", "%");
        // Only a key this layout would write for that name.
        (self.lock_key(prefix, &name) == format!("{prefix}{{{escaped}}}")).then_some(name)
    }
}

fn key(name: &str, holder: &str) -> (String, String) {
    (name.to_owned(), holder.to_owned())
}

/// A new random token: 128 bits, as 32 hex digits. `RandomState` is seeded
/// from the OS's randomness and differs for every instance; the counter and
/// the clock make each pair of hashes unique.
fn new_token() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = (
        COUNTER.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now(),
        std::process::id(),
    );
    let (a, b) = (
        RandomState::new().hash_one(seed),
        RandomState::new().hash_one(seed),
    );
    format!("{a:016x}{b:016x}")
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn fenced_keys_are_distinct_and_share_a_hash_tag() {
        let names = [
            "a", "a}", "a}:fence", "a:fence", "{a}", "}x", "{", "}", "%", "%25", "%7B", "%7D",
            "%%", "{}", "🦀", "a b", "'\"",
        ];
        let mut keys = HashSet::new();
        for name in names {
            let lock = LockProtocol::Fenced.lock_key("p:", name);
            let fence = format!("{lock}:fence");
            // The hash tag is everything between the prefix's `{` and the last `}`.
            let inner = &lock["p:{".len()..lock.len() - 1];
            assert!(!inner.contains(['{', '}']), "{name:?} -> {lock}");
            assert!(lock.starts_with("p:{") && lock.ends_with('}'), "{lock}");
            assert_eq!(
                LockProtocol::Fenced.name_of_key("p:", fence.as_bytes()),
                Some(name.to_owned())
            );
            assert!(keys.insert(lock) && keys.insert(fence), "{name:?} collides");
        }
        assert_eq!(LockProtocol::Fenced.lock_key("p:", "%{}"), "p:{%25%7B%7D}");
    }

    #[test]
    fn go_locker_keys_are_the_prefix_and_the_name_and_values_its_tokens() {
        let tokens = GoTokens::default();
        let go = LockProtocol::GoLocker(tokens.clone());
        assert_eq!(go.lock_key("lock:", "50% {off}"), "lock:50% {off}");
        let lease = Acquisition::new("report", "pod", None);
        // Nothing to renew or release without a token of this backend.
        assert_eq!(go.lock_value(lease), None);
        let key = go.lock_key("lock:", "report");
        let granted = futures_util::FutureExt::now_or_never(LockProtocol::go_acquire(
            &tokens,
            key,
            "report",
            "pod",
            1000,
            |_| async { Ok(1) },
        ))
        .expect("ready")
        .expect("granted");
        assert_eq!(granted.map(|g| g.fencing_token), Some(None));
        let token = go.lock_value(lease).expect("a token of its own");
        assert_eq!(token.len(), 32);
        assert_eq!(
            LockProtocol::Fenced
                .lock_value(Acquisition::new("report", "pod", Some(3)))
                .as_deref(),
            Some("3:pod")
        );
    }

    #[test]
    fn the_acquire_scripts_answers() {
        let granted = LockProtocol::fenced_acquired(&[1, 7, -1, -1]).expect("granted");
        assert_eq!(granted, Acquired::Granted(Grant::new(Some(7))));
        let slot = LockProtocol::fenced_acquired(&[1, 7, 12, 10]).expect("granted");
        assert_eq!(
            slot,
            Acquired::Granted(Grant::new(Some(7)).with_slot(12, Some(10)))
        );
        let first = LockProtocol::fenced_acquired(&[1, 7, 12, -1]).expect("granted");
        assert_eq!(
            first,
            Acquired::Granted(Grant::new(Some(7)).with_slot(12, None))
        );
        let held = LockProtocol::fenced_acquired(&[0, 1500]).expect("held");
        let expires_in = Some(Duration::from_millis(1500));
        assert_eq!(held, Acquired::HeldElsewhere { expires_in });
        // No expiry (-1), or gone meanwhile (-2): no instant to wait for.
        for pttl in [-1, -2] {
            let held = LockProtocol::fenced_acquired(&[0, pttl]).expect("held");
            assert_eq!(held, Acquired::HeldElsewhere { expires_in: None });
        }
        let ran = LockProtocol::fenced_acquired(&[2, 12]).expect("ran");
        assert_eq!(ran, Acquired::AlreadyRan { slot: 12 });
        for bad in [&[][..], &[1, 0, -1, -1], &[3, 1], &[2, -1], &[1, 7]] {
            assert!(LockProtocol::fenced_acquired(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_keys_beside_a_lock_name_it_and_nothing_else_does() {
        let fenced = LockProtocol::Fenced;
        for tail in ["", ":fence", ":slot", ":value"] {
            let key = format!("p:{{a%7Bb}}{tail}");
            assert_eq!(
                fenced.name_of_key("p:", key.as_bytes()).as_deref(),
                Some("a{b")
            );
        }
        for other in ["p:{a}:other", "p:{a}:fencing-token", "p:{}:slot", "q:{a}"] {
            assert_eq!(fenced.name_of_key("p:", other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn a_value_is_reported_for_its_own_acquisition_while_held() {
        let fenced = LockProtocol::Fenced;
        let held = |lock: &str, value: &str| {
            let answer = (
                Some(lock.to_owned()),
                1000,
                Some("7".to_owned()),
                Some("12".to_owned()),
                Some(value.to_owned()),
            );
            fenced.lease_info("n", &answer).expect("a lease")
        };
        let info = held("7:pod", "7:10.0.0.7:80");
        assert_eq!(info.value.as_deref(), Some("10.0.0.7:80"));
        assert_eq!((info.slot, info.forced), (Some(12), false));
        assert_eq!(held("7:pod", "6:old").value, None, "another acquisition's");
        let forced = held("7:", "7:v");
        assert!(forced.forced && forced.holder.is_empty() && forced.value.is_none());
        let gone = (None, -2, Some("7".to_owned()), Some("12".to_owned()), None);
        let info = fenced.lease_info("n", &gone).expect("the fence and ledger");
        assert_eq!((info.expires_in, info.slot), (None, Some(12)));
        assert!(
            fenced
                .lease_info("n", &(None, -2, None, None, None))
                .is_none()
        );
    }

    #[test]
    fn tokens_are_random_and_distinct() {
        let tokens: HashSet<String> = (0..1000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 1000);
        for token in &tokens {
            assert_eq!(token.len(), 32);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        }
    }
}
