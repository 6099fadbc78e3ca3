//! The keys of a lease name: the lease key `{prefix}{name}`, and beside
//! it the published value and the ledger of slots.

use etcd_client::KeyValue;

/// The byte after a lease name in the keys beside its lease key: UTF-8
/// never uses it, so no lease name's key is one of them.
const BESIDE: u8 = 0xff;
/// After the name: the value published with the lease.
pub(super) const VALUE: &[u8] = b"\xffvalue";
/// After the name: the ledger, one key per slot recorded (20 digits, so
/// that keys sort as slots do; usually one, the last).
pub(super) const SLOT: &[u8] = b"\xffslot/";
/// After the name: the end of the ledger's range (`SLOT`, its `/` raised).
pub(super) const SLOTS_END: &[u8] = b"\xffslot0";

/// Which of a lease name's keys an etcd key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EtcdKey {
    /// The lease key, `{prefix}{name}`.
    Lease,
    /// The value published with the lease.
    Value,
    /// A slot recorded in the ledger.
    Slot(u64),
}

impl EtcdKey {
    /// The name and the kind of a key without its prefix; `None` for a key
    /// that is none of a lease name's.
    pub(super) fn split(rest: &[u8]) -> Option<(&[u8], EtcdKey)> {
        let Some(at) = rest.iter().position(|&b| b == BESIDE) else {
            return Some((rest, EtcdKey::Lease));
        };
        let (name, beside) = rest.split_at(at);
        let kind = if beside == VALUE {
            EtcdKey::Value
        } else {
            let digits = beside.strip_prefix(SLOT)?;
            EtcdKey::Slot(std::str::from_utf8(digits).ok()?.parse().ok()?)
        };
        Some((name, kind))
    }
}

/// The keys of one lease name, as read.
#[derive(Default)]
pub(super) struct NameKeys {
    pub(super) lease: Option<KeyValue>,
    pub(super) value: Option<String>,
    pub(super) slot: Option<u64>,
}

impl NameKeys {
    /// Whether there is anything to report: a lease key or a ledger (a
    /// value alone is a leftover of a key deleted by hand).
    pub(super) fn any(&self) -> bool {
        self.lease.is_some() || self.slot.is_some()
    }

    pub(super) fn add(&mut self, kind: EtcdKey, kv: KeyValue) {
        match kind {
            EtcdKey::Lease => self.lease = Some(kv),
            EtcdKey::Value => self.value = Some(String::from_utf8_lossy(kv.value()).into_owned()),
            EtcdKey::Slot(slot) => self.slot = self.slot.max(Some(slot)),
        }
    }
}
