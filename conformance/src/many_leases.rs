//! Thousands of leases at once: what a backend that holds many leases for
//! one process (a batch of renewals) must do.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use leasehold::{Acquisition, Backend};

use crate::Subject;
use crate::support::{LONG, acquired, unique};

/// `Backend::renew_many` with more leases than one statement (or script)
/// takes: 2,345 leases, every seventh taken over by another holder, every
/// eleventh never acquired.
pub async fn a_batch_larger_than_a_chunk<S: Subject>(s: &S) {
    let b = s.backend();
    let holder = unique("holder");
    let thief = unique("thief");
    let prefix = unique("renew-many-big");
    let names: Vec<String> = (0..2345).map(|i| format!("{prefix}-{i}")).collect();
    let expected: Vec<bool> = (0..names.len())
        .map(|i| i % 7 != 3 && i % 11 != 5)
        .collect();
    // A few acquisitions in flight at a time, as an application would: all
    // 2,345 at once made a queue of thousands of consensus writes on the
    // etcd cluster, where the last waited past the backend's time limit on
    // a loaded machine; what is tested here is the batch renewal.
    let fences: Vec<Option<u64>> = stream::iter(names.iter().enumerate().map(|(i, name)| {
        let (b, holder, thief) = (&b, &holder, &thief);
        async move {
            if i % 11 == 5 {
                return Some(1);
            }
            if i % 7 == 3 {
                acquired(b, name, thief, LONG).await
            } else {
                acquired(b, name, holder, LONG).await
            }
        }
    }))
    .buffered(32)
    .collect()
    .await;
    let batch: Vec<(Acquisition<'_>, Duration)> = names
        .iter()
        .zip(fences)
        .map(|(n, f)| (Acquisition::new(n, &holder, f), LONG))
        .collect();
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed.len(), names.len());
    let wrong: Vec<usize> = (0..names.len())
        .filter(|&i| renewed[i] != expected[i])
        .collect();
    assert!(wrong.is_empty(), "wrong answers at {wrong:?}");
}
