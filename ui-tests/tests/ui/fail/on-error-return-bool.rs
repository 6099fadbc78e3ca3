use leasehold::singleton;

// A `bool` has no room for the error: `on_error = "return"` needs a `Result`.
#[singleton(name = "digest", ttl = "90s", on_error = "return")]
async fn send_digest() -> bool {
    true
}

fn main() {}
