use leasehold::singleton;

// More than half the ttl leaves too little time to retry failed renewals.
#[singleton(name = "digest", ttl = "90s", grace = "46s")]
async fn send_digest() {}

fn main() {}
