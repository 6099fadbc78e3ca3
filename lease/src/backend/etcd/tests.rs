//! Unit tests of the renewal verdict and the key layout.

use super::*;

const OURS: KeySeen = KeySeen {
    create_revision: 40,
    lease: 7,
    holder_matches: true,
};

#[test]
fn a_renewal_that_does_not_find_its_key_is_lost() {
    assert!(verdict(true, Some(OURS), 40, 7));
    assert!(!verdict(true, None, 40, 7), "no key");
    assert!(!verdict(true, Some(OURS), 41, 7), "another acquisition");
    assert!(!verdict(true, Some(OURS), 40, 8), "another etcd lease");
    let other_holder = KeySeen {
        holder_matches: false,
        ..OURS
    };
    assert!(!verdict(true, Some(other_holder), 40, 7));
    assert!(!verdict(false, Some(OURS), 40, 7), "the etcd lease is gone");
}

#[test]
fn the_keys_beside_a_lease_are_no_lease_names() {
    let split = |key: &'static [u8]| EtcdKey::split(key);
    assert_eq!(split(b"a/job"), Some((&b"a/job"[..], EtcdKey::Lease)));
    assert_eq!(split(b"job\xffvalue"), Some((&b"job"[..], EtcdKey::Value)));
    let slot = split(b"job\xffslot/00000000000000000042");
    assert_eq!(slot, Some((&b"job"[..], EtcdKey::Slot(42))));
    assert_eq!(split(b"job\xffother"), None, "not this backend's");
    assert_eq!(split(b"job\xffslot/x"), None);
    // Ledger keys sort as their slots do.
    let key = |slot: u64| format!("{slot:020}");
    assert!(key(9) < key(10) && key(10) < key(u64::MAX));
}

#[test]
fn ttls_round_up_to_whole_seconds() {
    assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(10)), 1);
    assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(1_000)), 1);
    assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(1_001)), 2);
    assert_eq!(Etcd::lease_ttl_secs(Duration::from_secs(86_400)), 86_400);
}
