//! The `Backend` calls themselves (acquire, renew, release), and racing
//! contenders: the core of the `every` group, which every backend must
//! pass.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold::{Acquisition, Backend, Error, Lease, Outcome, Skip};
use tokio::time::sleep;

use crate::Subject;
use crate::support::{
    LONG, TTL, acq, acquire, acquired, fence, lapse, lease, ms, release, renew, unique,
};

/// Of two holders, only one has a lease at a time: the other's
/// `try_acquire` answers `None` and its `with_lease` skips
/// (`Skip::HeldElsewhere`), whatever the ttl it asks for, and its attempts
/// change nothing (the holder re-acquires with its fencing token, 1 for a
/// new name). Once released, the other runs.
pub async fn exclusive_between_two_holders<S: Subject>(s: &S) {
    let name = unique("exclusive");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let guard = a
        .try_acquire(&name, TTL)
        .await
        .unwrap()
        .expect("free lease");
    assert_eq!(guard.fencing_token(), fence(s, 1));
    assert!(
        b.try_acquire(&name, TTL).await.unwrap().is_none(),
        "b acquired a held lease"
    );
    let skipped = b.with_lease(&name, TTL, |_| async { "b ran" }).await;
    assert!(
        matches!(skipped, Outcome::Skipped(Skip::HeldElsewhere)),
        "{skipped:?}"
    );
    // Asked of the backend directly, whatever the ttl: refused too. The
    // failed attempts changed nothing: a still holds it, with its fence.
    let backend = s.backend();
    assert_eq!(acquire(&backend, &name, "holder-b", LONG).await, None);
    assert_eq!(acquire(&backend, &name, "holder-b", ms(10)).await, None);
    assert_eq!(
        acquire(&backend, &name, "holder-a", TTL).await,
        Some(fence(s, 1))
    );
    guard.release().await.unwrap();
    let out = b.with_lease(&name, TTL, |_| async { "b ran" }).await;
    assert_eq!(out.into_result().unwrap(), Some("b ran"));
}

/// An acquire by the holder of a live lease (through the backend, or a
/// `Lease` with the same holder) grants it again with the same fencing
/// token and keeps the acquisition renewable; a release then a re-acquire
/// is a new acquisition, with a larger token.
pub async fn idempotent_reacquire_keeps_the_fence<S: Subject>(s: &S) {
    let name = unique("idempotent");
    let b = s.backend();
    let first = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(
        first.fencing_token,
        fence(s, 1),
        "a name's first acquisition"
    );
    for _ in 0..2 {
        let again = b
            .acquire(&name, "holder-a", TTL)
            .await
            .unwrap()
            .expect("same holder re-acquires");
        assert_eq!(first.fencing_token, again.fencing_token);
    }
    assert!(
        b.renew(acq(&name, "holder-a", &first), TTL).await.unwrap(),
        "re-acquires keep the acquisition"
    );
    assert!(b.acquire(&name, "holder-b", TTL).await.unwrap().is_none());
    b.release(acq(&name, "holder-a", &first)).await.unwrap();
    // A Lease with the same holder (say, a restarted process that kept its
    // identity) re-acquires a live lease idempotently too.
    let g = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free after release");
    let twin = lease(s, "holder-a")
        .try_acquire(&name, TTL)
        .await
        .unwrap()
        .expect("same holder");
    assert_eq!(twin.fencing_token(), g.fencing_token);
    if s.caps().fencing {
        assert!(
            g.fencing_token > first.fencing_token,
            "release then re-acquire is a new acquisition"
        );
    }
    twin.release().await.unwrap();
}

/// A lease nobody renews is taken over once it expired (or, without
/// expiry, once its holder's session ended) with the next fencing token;
/// the old holder can then neither renew, re-acquire nor release it.
pub async fn takeover_after_expiry_has_a_larger_fence<S: Subject>(s: &S) {
    let name = unique("takeover");
    let b = s.backend();
    let ttl = ms(300);
    let first = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    assert!(
        b.acquire(&name, "holder-b", LONG).await.unwrap().is_none(),
        "not expired yet"
    );
    lapse(s, acq(&name, "holder-a", &first), ttl).await;
    let second = b
        .acquire(&name, "holder-b", LONG)
        .await
        .unwrap()
        .expect("expired lease is free");
    assert_eq!(second.fencing_token, fence(s, 2));
    if s.caps().fencing {
        assert!(second.fencing_token.unwrap() > first.fencing_token.unwrap());
    }
    // The old holder lost it: it can neither renew, re-acquire nor release it.
    assert!(
        !b.renew(acq(&name, "holder-a", &first), LONG).await.unwrap(),
        "the old holder lost it"
    );
    assert_eq!(acquire(&b, &name, "holder-a", LONG).await, None);
    b.release(acq(&name, "holder-a", &first)).await.unwrap();
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "still b's"
    );
    b.release(acq(&name, "holder-b", &second)).await.unwrap();
}

/// Each acquisition after a release, by the same holder or another, gets
/// the next fencing token (1, 2, 3, 4); a second release of a released
/// lease is a no-op.
pub async fn release_then_reacquire_increments_fence<S: Subject>(s: &S) {
    let name = unique("release-reacquire");
    let b = s.backend();
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1))
    );
    release(&b, &name, "holder-a", fence(s, 1)).await;
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 2)),
        "a new acquisition"
    );
    release(&b, &name, "holder-a", fence(s, 2)).await;
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 3))
    );
    release(&b, &name, "holder-b", fence(s, 3)).await;
    release(&b, &name, "holder-b", fence(s, 3)).await; // twice: a no-op
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 4))
    );
}

/// A renewal extends a live lease past its first expiry, and keeps its
/// fencing token. Without expiry the lease outlives its ttl anyway; the
/// renewals must still succeed and keep the acquisition.
pub async fn renew_extends_a_live_lease<S: Subject>(s: &S) {
    let name = unique("renew-extends");
    let b = s.backend();
    let ttl = TTL;
    assert_eq!(acquire(&b, &name, "holder-a", ttl).await, Some(fence(s, 1)));
    sleep(ttl / 2).await;
    assert!(renew(&b, &name, "holder-a", fence(s, 1), ttl).await);
    // 1.2 ttls after acquiring: the original expiry has passed, the renewed
    // one not (0.3 ttls to spare).
    sleep(ttl * 7 / 10).await;
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        None,
        "renewal extended it"
    );
    assert!(renew(&b, &name, "holder-a", fence(s, 1), LONG).await);
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1)),
        "renewals keep the fence"
    );
}

/// A renewal of a name nobody holds answers `false` and creates nothing:
/// the next acquisition is a name's first (fencing token 1).
pub async fn renew_never_inserts<S: Subject>(s: &S) {
    let name = unique("renew-insert");
    let b = s.backend();
    for fence in [None, Some(1)] {
        let lease = Acquisition::new(&name, "holder-a", fence);
        assert!(!b.renew(lease, TTL).await.unwrap());
    }
    // Had renew inserted a lease, "b" would be refused or get a later fence.
    let g = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("renew must not have created a lease");
    assert_eq!(g.fencing_token, fence(s, 1));
}

/// A renewal answers `false` once the lease was taken over, released or
/// expired, and never brings it back (no silent re-acquire after a gap);
/// an expired lease re-acquired by its old holder is a new acquisition.
pub async fn renew_fails_after_takeover_release_and_expiry<S: Subject>(s: &S) {
    let b = s.backend();
    let ttl = ms(300);

    let name = unique("renew-takeover");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    assert!(b.renew(a, ttl).await.unwrap());
    lapse(s, a, ttl).await;
    let taken = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("expired lease is free");
    assert!(
        !b.renew(a, ttl).await.unwrap(),
        "renewed someone else's lease"
    );
    assert!(b.renew(acq(&name, "holder-b", &taken), TTL).await.unwrap());

    let name = unique("renew-release");
    let a = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    b.release(a).await.unwrap();
    assert!(!b.renew(a, TTL).await.unwrap(), "renewed a released lease");
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "released means free"
    );

    let name = unique("renew-expiry");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    lapse(s, a, ttl).await;
    assert!(
        !b.renew(a, TTL).await.unwrap(),
        "renewed an expired lease: no silent re-acquire after a gap"
    );
    // ...and the failed renewal did not bring it back.
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "the failed renew kept it expired"
    );

    // An expired lease re-acquired by its old holder is a new acquisition.
    let name = unique("reacquire-expired");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    lapse(s, acq(&name, "holder-a", &a), ttl).await;
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 2))
    );
}

/// Renewing or releasing a lease one does not hold — held by another
/// holder, never acquired, or expired — changes nothing.
pub async fn renew_and_release_by_a_non_holder_do_nothing<S: Subject>(s: &S) {
    let name = unique("non-holder");
    let b = s.backend();
    let a = b
        .acquire(&name, "holder-a", LONG)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(a.fencing_token, fence(s, 1));
    // Another holder, with the fence of a's acquisition: only the holder differs.
    assert!(!b.renew(acq(&name, "holder-b", &a), LONG).await.unwrap());
    b.release(acq(&name, "holder-b", &a)).await.unwrap();
    // A name nobody ever acquired.
    b.release(Acquisition::new(&unique("never-seen"), "holder-b", Some(1)))
        .await
        .unwrap();
    b.release(Acquisition::new(&unique("never-seen"), "holder-b", None))
        .await
        .unwrap();
    assert!(
        b.acquire(&name, "holder-b", TTL).await.unwrap().is_none(),
        "a stranger released our lease"
    );
    assert!(b.renew(acq(&name, "holder-a", &a), TTL).await.unwrap());
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1)),
        "still a's acquisition"
    );

    // An expired lease: its old holder's release is a no-op too.
    let name = unique("release-expired");
    let ttl = ms(300);
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    lapse(s, acq(&name, "holder-a", &a), ttl).await;
    match b.release(acq(&name, "holder-a", &a)).await {
        Ok(()) => {}
        // Without expiry the lease ended with its holder's session, and a
        // backend may release on that session (`PgAdvisory` unlocks on its
        // connection): it reports the session's end ("terminating
        // connection") as the server's error, which a backend error keeps
        // as its source (`Error::Database` there).
        Err(e) if !s.caps().expires && std::error::Error::source(&e).is_some() => {}
        Err(e) => panic!("release of an expired lease: {e}"),
    }
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2))
    );
}

/// Fencing tokens strictly increase over 100 acquisitions of one name by
/// two alternating holders; without fencing, every token is `None`.
pub async fn fences_strictly_increase<S: Subject>(s: &S) {
    let name = unique("fences");
    let holders = [lease(s, "holder-a"), lease(s, "holder-b")];
    let mut last = None;
    for i in 0..100 {
        let guard = holders[i % 2]
            .try_acquire(&name, TTL)
            .await
            .unwrap()
            .expect("released lease is free");
        let fence = guard.fencing_token();
        if s.caps().fencing {
            let fence = fence.expect("fencing backend gave no token");
            if let Some(last) = last {
                assert!(fence > last, "acquisition {i}: fence {fence} after {last}");
            }
            last = Some(fence);
        } else {
            assert_eq!(fence, None);
        }
        guard.release().await.unwrap();
    }
}

/// Names are data: quotes, SQL, `LIKE` wildcards, escapes, braces, key
/// separators, case, whitespace, Unicode spellings and 255-byte names that
/// differ only in their last bytes are each a name of its own, held at
/// once by different holders, renewed and released one by one, through
/// the backend and through `Lease`.
pub async fn names_are_data<S: Subject>(s: &S) {
    let tag = unique("n");
    let mut names: Vec<String> = [
        // Quotes, SQL, `LIKE` wildcards, escapes, format braces, key separators.
        "it's",
        "it''s",
        "\"quoted\"",
        "it's \"quoted\" `x`",
        "'; drop table task_leases; --",
        "'); DROP TABLE task_leases; --",
        "100%",
        "100_",
        "1000",
        "1_0",
        "10",
        "%_",
        "a\\b",
        "a\\\\b",
        "back\\slash",
        "back\\\\slash",
        "{braces}",
        "{",
        "}x",
        "{}",
        "{table}",
        "x:fence",
        // Case, whitespace, Unicode (é, and e + combining acute: another
        // spelling of é).
        "Case",
        "case",
        "x",
        "X",
        "x ",
        " x",
        "trailing ",
        "trailing",
        "e",
        "é",
        "e\u{301}",
        "🦀",
        "🦀🦀",
        "🦀 crab",
    ]
    .iter()
    .map(|n| format!("{tag}-{n}"))
    .collect();
    // Exactly 255 bytes, ending in a 4-byte character.
    let mut long = format!("{tag}-");
    while long.len() < 251 {
        long.push('x');
    }
    long.push('🦀');
    assert_eq!(long.len(), 255);
    names.push(long);
    // 255 bytes, the same less its last byte, and the same first 253 bytes
    // followed by a 2-byte character: a server that truncated names would
    // make them collide.
    let mut padded = format!("{tag}-");
    while padded.len() < 255 {
        padded.push('z');
    }
    names.push(padded[..254].to_owned());
    names.push(format!("{}é", &padded[..253]));
    names.push(padded);

    // Every name held at once, each by a holder of its own: two names that
    // collided would refuse one holder, or hand it a later fence.
    let b = s.backend();
    let holders: Vec<String> = (0..names.len()).map(|i| format!("holder-{i}")).collect();
    for (name, holder) in names.iter().zip(&holders) {
        assert_eq!(
            acquire(&b, name, holder, LONG).await,
            Some(fence(s, 1)),
            "{name:?} is new"
        );
    }
    for (name, holder) in names.iter().zip(&holders) {
        assert_eq!(acquire(&b, name, "intruder", LONG).await, None, "{name:?}");
        assert!(renew(&b, name, holder, fence(s, 1), LONG).await, "{name:?}");
        release(&b, name, holder, fence(s, 1)).await;
        assert_eq!(
            acquire(&b, name, holder, LONG).await,
            Some(fence(s, 2)),
            "{name:?}"
        );
    }
    // Releasing one name released no other (`%` and `_` are no wildcards).
    for (name, holder) in names.iter().zip(&holders) {
        assert!(renew(&b, name, holder, fence(s, 2), LONG).await, "{name:?}");
        release(&b, name, holder, fence(s, 2)).await;
    }

    // The same names through `Lease`.
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    let mut guards = Vec::new();
    for name in &names {
        let g = a
            .try_acquire(name, TTL)
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        guards.push(g.unwrap_or_else(|| panic!("{name:?} was not released")));
    }
    for name in &names {
        assert!(
            b.try_acquire(name, TTL).await.unwrap().is_none(),
            "{name:?} not held"
        );
    }
    for g in guards {
        assert!(g.is_valid());
        g.release().await.unwrap();
    }
    for name in &names {
        assert!(
            b.try_acquire(name, TTL).await.unwrap().is_some(),
            "{name:?} not released"
        );
    }
}

/// Holders are compared byte for byte: case, whitespace, accents and
/// prefixes make another holder, which can neither re-acquire, renew nor
/// release the lease; a 255-byte holder is kept whole.
pub async fn holders_are_compared_exactly<S: Subject>(s: &S) {
    let b = s.backend();
    let name = unique("holders");
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(fence(s, 1)));
    for other in ["POD", "pod ", " pod", "pöd", "po", "pod\t"] {
        assert_eq!(acquire(&b, &name, other, LONG).await, None, "{other:?}");
        assert!(
            !renew(&b, &name, other, fence(s, 1), LONG).await,
            "{other:?}"
        );
        release(&b, &name, other, fence(s, 1)).await;
    }
    assert!(renew(&b, &name, "pod", fence(s, 1), LONG).await);
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(fence(s, 1)));
    let long = "h".repeat(255);
    let name = unique("holders-long");
    assert_eq!(acquire(&b, &name, &long, LONG).await, Some(fence(s, 1)));
    assert_eq!(acquire(&b, &name, &long[..254], LONG).await, None);
    assert!(renew(&b, &name, &long, fence(s, 1), LONG).await);
}

/// An empty or over-long name and a ttl out of bounds (or not whole
/// milliseconds) are refused with `Error::InvalidName` and
/// `Error::InvalidTtl`, both bounds accepted: through [`Lease`], which
/// checks its input before calling any backend.
pub async fn invalid_input_is_rejected<S: Subject>(s: &S) {
    let a = lease(s, "holder-a");
    assert!(matches!(
        a.try_acquire("", TTL).await,
        Err(Error::InvalidName { len: 0 })
    ));
    let long = "x".repeat(256);
    assert!(matches!(
        a.try_acquire(&long, TTL).await,
        Err(Error::InvalidName { len: 256 })
    ));
    let name = unique("ttl");
    for ttl in [
        Duration::ZERO,
        ms(9),
        Duration::from_secs(86_400) + ms(1),
        Duration::from_micros(20_500),
    ] {
        assert!(
            matches!(
                a.try_acquire(&name, ttl).await,
                Err(Error::InvalidTtl { .. })
            ),
            "{ttl:?}"
        );
    }
    // Both bounds are accepted (inclusive). A 10 ms ttl leaves the acquire
    // 7.9 ms (ttl - margin) and the release 10 ms, which a loaded machine
    // can miss: a timeout there is not a rejection of the ttl. Each bound
    // gets a name of its own, so that a timed-out acquire cannot leave the
    // other one's name taken.
    for ttl in [ms(10), Duration::from_secs(86_400)] {
        let tolerate_timeout = ttl == ms(10);
        match a.try_acquire(&unique("ttl-bound"), ttl).await {
            Ok(Some(g)) => match g.release().await {
                Ok(()) => {}
                Err(Error::Timeout { .. }) if tolerate_timeout => {}
                Err(e) => panic!("{ttl:?}: release failed: {e}"),
            },
            Err(Error::Timeout { .. }) if tolerate_timeout => {}
            other => panic!("{ttl:?}: bounds are inclusive, got {other:?}"),
        }
    }
    let out = a.with_lease("", TTL, |_| async {}).await;
    assert!(matches!(
        out,
        Outcome::Skipped(Skip::Error(Error::InvalidName { .. }))
    ));
}

/// Sixteen `Lease`s try for one name at once, 200 times: each round has
/// exactly one winner, with a larger fencing token than the last.
pub async fn one_winner_among_sixteen_contenders<S: Subject>(s: &S) {
    let name = unique("contenders");
    let pods: Vec<Lease> = (0..16).map(|i| lease(s, &format!("pod-{i:02}"))).collect();
    let mut last_fence = None;
    for round in 0..200 {
        let results = join_all(pods.iter().map(|p| p.try_acquire(&name, TTL))).await;
        let mut winners = Vec::new();
        for r in results {
            match r {
                Ok(Some(g)) => winners.push(g),
                Ok(None) => {}
                Err(e) => panic!("round {round}: acquisition failed: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        let winner = winners.pop().expect("one winner");
        if s.caps().fencing {
            let fence = winner.fencing_token();
            assert!(
                fence > last_fence,
                "round {round}: fence {fence:?} after {last_fence:?}"
            );
            last_fence = fence;
        }
        winner.release().await.unwrap();
    }
}

/// `n` holders race for `name` at once; the grants, one per holder.
pub(crate) async fn race<B: Backend + Clone>(
    b: &B,
    name: &str,
    n: usize,
    ttl: Duration,
) -> Vec<Option<Option<u64>>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks = (0..n).map(|i| {
        let (b, name, barrier) = (b.clone(), name.to_owned(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            b.acquire(&name, &format!("racer-{i}"), ttl).await
        })
    });
    join_all(tasks)
        .await
        .into_iter()
        .map(|r| {
            let grant = r
                .expect("task")
                .expect("acquire must not fail under contention");
            grant.map(|g| g.fencing_token)
        })
        .collect()
}

/// Sixteen holders acquire a name nobody has used at the same moment
/// (through the backend): one is granted it, with fencing token 1.
pub async fn concurrent_acquire_of_a_new_name_has_one_winner<S: Subject>(s: &S) {
    let b = s.backend();
    for round in 0..5 {
        let name = unique("new-name-race");
        let grants = race(&b, &name, 16, LONG).await;
        let winners: Vec<_> = grants.iter().flatten().collect();
        assert_eq!(winners, [&fence(s, 1)], "round {round}: {grants:?}");
    }
}

/// Sixteen holders take over an expired lease at the same moment: one is
/// granted it, with fencing token 2.
pub async fn concurrent_takeover_of_an_expired_lease_has_one_winner<S: Subject>(s: &S) {
    let b = s.backend();
    let name = unique("takeover-race");
    let ttl = ms(100);
    let first = acquired(&b, &name, "first", ttl).await;
    assert_eq!(first, fence(s, 1));
    lapse(s, Acquisition::new(&name, "first", first), ttl).await;
    let grants = race(&b, &name, 16, LONG).await;
    let winners: Vec<_> = grants.iter().flatten().collect();
    assert_eq!(winners, [&fence(s, 2)], "{grants:?}");
}
