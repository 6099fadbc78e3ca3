//! The Lua scripts of [`Redis`](super::Redis), and the hash slot of a key.
//!
//! Each call of the backend is one script: one round trip, atomic on the
//! server. Every script may run twice with the same effect as once, which
//! is what lets a call whose connection failed be sent again
//! (`connection.rs`). `redis::Script` sends `EVALSHA` and loads the script
//! on `NOSCRIPT`.

use std::sync::LazyLock;

use ::redis::Script;

pub(super) struct RedisScripts {
    pub(super) acquire: Script,
    pub(super) go_acquire: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) publish: Script,
    pub(super) force_release: Script,
    pub(super) force_release_now: Script,
    pub(super) inspect: Script,
    pub(super) scan: Script,
    pub(super) set_fenced: Script,
}

/// Built once: `Script::new` hashes the source for `EVALSHA`.
pub(super) static SCRIPTS: LazyLock<RedisScripts> = LazyLock::new(|| RedisScripts {
    // KEYS: lock, fence, ledger, value. ARGV: holder, ttl in ms, the
    // schedule's period in ms ('0': no slot to claim), '1' to record the
    // slot with the grant, '1' to publish a value (else the value key is
    // deleted), the value.
    //
    // Answers {1, fence, slot, last slot} (-1: none) when granted, {0,
    // PTTL} when another holder has the lock (or it was force-released:
    // its holder is empty), {2, slot} when the slot was recorded already.
    // The lock holds `{fence}:{holder}`, so an idempotent re-acquire
    // answers the lease's own fence even if the fence key was lost, and
    // puts the counter back up to it. The slot is `floor(TIME / period)`;
    // the ledger only grows. The value key holds `{fence}:{value}`: a value
    // of another acquisition is never taken for this one's.
    acquire: Script::new(
        r"
local slot, last = -1, -1
if ARGV[3] ~= '0' then
  if redis.replicate_commands then redis.replicate_commands() end
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  slot = math.floor(ms / tonumber(ARGV[3]))
  last = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
  if slot <= last then
    return {2, slot}
  end
end
local value = redis.call('GET', KEYS[1])
local fence
if value then
  local sep = string.find(value, ':', 1, true)
  fence = sep and tonumber(string.sub(value, 1, sep - 1))
  if not (fence and string.sub(value, sep + 1) == ARGV[1]) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
  if counter and counter < fence then
    redis.call('SET', KEYS[2], fence)
  end
else
  fence = redis.pcall('INCR', KEYS[2])
  if type(fence) ~= 'number' or fence < 1 then
    return redis.error_reply('lease: the fence key ' .. KEYS[2] .. ' does not hold a positive integer')
  end
  redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
end
if ARGV[4] == '1' and slot >= 0 then
  redis.call('SET', KEYS[3], string.format('%d', slot))
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[4], fence .. ':' .. ARGV[6])
else
  redis.call('DEL', KEYS[4])
end
return {1, fence, slot, last}
",
    ),
    // The Go locker's protocol. KEYS: lock. ARGV: the token of our live
    // acquisition of this name ('' if none), a new token, ttl in ms.
    // Answers 1 if the lock now holds the new token, 0 when another holder
    // has it. A free lock is taken with `SET NX PX`, as the Go locker takes
    // it. Our current token (an idempotent re-acquire) or already the new
    // one (this call, sent again) is replaced by the new one: every
    // acquisition has a token of its own, so a late release of an older one
    // never ends a newer one.
    go_acquire: Script::new(
        r"
local value = redis.call('GET', KEYS[1])
if not value then
  if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
    return 1
  end
  return 0
end
if value == ARGV[2] or (ARGV[1] ~= '' and value == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
",
    ),
    // KEYS: locks. ARGV: per key, the acquisition's lock value and the ttl
    // in ms. Answers per key, in order: 1 if renewed, 0 if the lock no
    // longer holds that acquisition. One key is a single renewal.
    renew: Script::new(
        r"
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    renewed[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed
",
    ),
    // KEYS: lock, and in the fenced layout the value key and the ledger.
    // ARGV: the acquisition's lock value, the channel of releases, the
    // lease name, and the slot run (only with the ledger: `release_ran`).
    // Records the slot (never lowering the ledger) whoever holds the lock;
    // deletes the lock and its value iff it holds that acquisition, and
    // then publishes the name (plain `PUBLISH`: it reaches every
    // subscriber, on one server and on every node of a cluster).
    release: Script::new(
        r"
if KEYS[3] then
  local last = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
  if tonumber(ARGV[4]) > last then
    redis.call('SET', KEYS[3], ARGV[4])
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local deleted = redis.call('DEL', KEYS[1])
  if KEYS[2] then
    redis.call('DEL', KEYS[2])
  end
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return deleted
end
return 0
",
    ),
    // KEYS: lock, value. ARGV: the acquisition's lock value, its fence,
    // '1' to set the value (else it is deleted), the value, the channel of
    // releases, the lease name. Iff the lock holds that acquisition: sets
    // the value key to `{fence}:{value}` (or deletes it), publishes the
    // name so that waiters and observers look again, answers 1; else 0.
    publish: Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[4])
else
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
",
    ),
    // The lock delay. KEYS: lock, and the value key if the layout has one.
    // ARGV: the channel of releases, the lease name, 'fenced' in the
    // fenced layout. A lock that names a
    // holder keeps its expiry and loses its holder: `{fence}:` (fenced),
    // '' (Go locker's). Its holder's renewals then fail, nobody's acquire
    // matches it, and it stays until its expiry. A lock without expiry
    // (never written by these scripts) has none to wait for: it is
    // deleted. Deletes the value, publishes the name, answers 1; answers 0
    // when there is no lock, or it was force-released already.
    force_release: Script::new(
        r"
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
local kept = ''
if ARGV[3] == 'fenced' then
  local sep = string.find(value, ':', 1, true)
  if sep then
    kept = string.sub(value, 1, sep)
  end
end
if kept == value then
  return 0
end
if redis.call('PTTL', KEYS[1]) > 0 then
  redis.call('SET', KEYS[1], kept, 'KEEPTTL')
else
  redis.call('DEL', KEYS[1])
end
if KEYS[2] then
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
",
    ),
    // KEYS: lock, and the value key if the layout has one. ARGV: the
    // channel of releases, the lease name. Deletes the lock whoever holds
    // it (the fence key and the ledger stay) and its value, and publishes
    // as `release` does. Answers 1 if a lock was deleted.
    force_release_now: Script::new(
        r"
if KEYS[2] then
  redis.call('DEL', KEYS[2])
end
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
",
    ),
    // KEYS: lock, and in the fenced layout the fence key, the ledger and
    // the value key. Answers the lock's value (nil if none), its `PTTL`
    // (-2: no lock, -1: no expiry), the fence counter, the ledger and the
    // value key (each nil if none).
    inspect: Script::new(
        r"
local value = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
local fence, slot, published = false, false, false
if KEYS[2] then
  fence = redis.call('GET', KEYS[2])
  slot = redis.call('GET', KEYS[3])
  published = redis.call('GET', KEYS[4])
end
return {value, ttl, fence, slot, published}
",
    ),
    // One step of `SCAN` (never `KEYS`, which blocks the server for the
    // whole keyspace). ARGV: cursor, `MATCH` pattern, `COUNT`. Answers as
    // `SCAN` does: the next cursor and this step's keys.
    scan: Script::new(
        r"
return redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
",
    ),
    // KEYS: a key, the key of the highest token it has seen. ARGV: the
    // value, the writer's token (decimal, no leading zeros). Sets the key
    // and answers 1 iff the token is at least the highest seen (compared
    // as decimal strings: exact for every u64); records it.
    set_fenced: Script::new(
        r"
local token = ARGV[2]
local highest = redis.call('GET', KEYS[2])
if highest and (#token < #highest or (#token == #highest and token < highest)) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
if token ~= highest then
  redis.call('SET', KEYS[2], token)
end
return 1
",
    ),
});

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag
/// (the part between the first `{` and the next `}`, if not empty) or of
/// the whole key, modulo 16384.
pub(super) fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::hash_slot;

    /// Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    #[test]
    fn hash_slots_are_redis_clusters() {
        assert_eq!(hash_slot("123456789"), 0x31C3); // CRC16-XMODEM check value
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        assert_eq!(
            hash_slot("lease:{report}"),
            hash_slot("lease:{report}:fence")
        );
    }
}
