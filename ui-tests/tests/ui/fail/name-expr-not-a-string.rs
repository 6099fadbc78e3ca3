use leasehold::singleton;

// An expression is evaluated at run time, but it must give a string.
#[singleton(name = tenant_id, ttl = "90s")]
async fn send_digest(tenant_id: u64) {}

fn main() {}
