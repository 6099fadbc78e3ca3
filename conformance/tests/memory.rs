//! The suite on `leasehold::backend::Memory`, as a backend author runs it
//! on theirs: from outside the crate, through `conformance!`. No server.

use std::time::Duration;

use leasehold::Backend;
use leasehold::backend::Memory;
use leasehold_conformance::{Ordinal, Subject};

/// `Memory`: a steal expires the holder's lease and acquires it for the
/// thief, as another client rewriting the record would.
struct MemorySubject(Memory);

impl Subject for MemorySubject {
    type B = Memory;

    fn backend(&self) -> Memory {
        self.0.clone()
    }

    async fn steal(&self, name: &str, thief: &str) {
        self.0.expire(name);
        let grant = self.0.acquire(name, thief, Duration::from_secs(60)).await;
        grant.expect("acquire").expect("free once expired");
    }
}

async fn memory() -> Option<MemorySubject> {
    Some(MemorySubject(Memory::new()))
}

leasehold_conformance::conformance!(
    memory,
    super::memory(),
    [every, fenced, many_leases, operating, extended]
);

/// `Memory` through [`Ordinal`], which must change nothing for tokens that
/// count per name already; the thief's token is ranked as the next one.
struct OrdinalSubject(Ordinal<Memory>);

impl Subject for OrdinalSubject {
    type B = Ordinal<Memory>;

    fn backend(&self) -> Ordinal<Memory> {
        self.0.clone()
    }

    async fn steal(&self, name: &str, thief: &str) {
        let memory = self.0.inner();
        memory.expire(name);
        let grant = memory.acquire(name, thief, Duration::from_secs(60)).await;
        let grant = grant.expect("acquire").expect("free once expired");
        self.0.rank(name, grant.fencing_token.expect("a token"));
    }
}

async fn ordinal() -> Option<OrdinalSubject> {
    Some(OrdinalSubject(Ordinal::new(Memory::new())))
}

leasehold_conformance::conformance!(ordinal_memory, super::ordinal(), [every, fenced]);
