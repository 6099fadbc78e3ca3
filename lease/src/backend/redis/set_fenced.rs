//! [`Redis::set_fenced`]: writes to Redis data that a stale lease holder
//! cannot make.

use super::Redis;
use super::scripts::SCRIPTS;
use crate::Error;

impl Redis {
    /// Set `key` to `value` iff `token` is at least the highest fencing
    /// token `key` has been written with: a holder that lost its lease (a
    /// pause past its ttl, say) and writes with its old token after the
    /// next holder wrote with a larger one is refused (`Ok(false)`), and
    /// the key keeps the newer value. `Ok(true)` when written.
    ///
    /// One script, one round trip: it compares `token` with the one
    /// recorded in [`fencing_token_key(key)`](Redis::fencing_token_key) (no
    /// expiry), and sets both. `key` is used as given, without the
    /// backend's prefix; on a Redis Cluster it must carry a hash tag
    /// (`report:{daily}`, say), so that both keys share a hash slot (else
    /// the cluster refuses the script: `CROSSSLOT`). The
    /// tokens of one key must come from one lease (its
    /// [`fencing_token`](crate::LeaseGuard::fencing_token)s grow with each
    /// acquisition).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the server refuses or cannot be reached,
    /// [`Error::Timeout`] after the backend's timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold::{backend::Redis, Lease};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), leasehold::Error> {
    /// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
    /// let lease = Lease::new(redis.clone());
    /// if let Some(guard) = lease.try_acquire("report", Duration::from_secs(30)).await? {
    ///     let token = guard.fencing_token().expect("Redis hands out fencing tokens");
    ///     // ... compute the report, possibly for longer than the ttl ...
    ///     if !redis.set_fenced("report:{daily}", "the report", token).await? {
    ///         // A newer holder has written: this one's result is stale.
    ///     }
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn set_fenced(
        &self,
        key: &str,
        value: impl AsRef<[u8]>,
        token: u64,
    ) -> Result<bool, Error> {
        let mut call = SCRIPTS.set_fenced.key(key);
        call.key(Self::fencing_token_key(key))
            .arg(value.as_ref())
            .arg(token.to_string());
        Ok(self.run_one::<i64>("set_fenced", call).await? == 1)
    }

    /// Where [`set_fenced`](Redis::set_fenced) records the highest fencing
    /// token `key` was written with: `key` followed by `:fencing-token`.
    ///
    /// ```
    /// use leasehold::backend::Redis;
    ///
    /// assert_eq!(Redis::fencing_token_key("report:{daily}"), "report:{daily}:fencing-token");
    /// ```
    pub fn fencing_token_key(key: &str) -> String {
        format!("{key}:fencing-token")
    }
}
