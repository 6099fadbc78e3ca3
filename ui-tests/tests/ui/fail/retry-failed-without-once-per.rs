use leasehold::singleton;

// `retry_failed` says what a failed run does to its schedule slot: without
// `once_per` there is none.
#[singleton(name = "digest", ttl = "90s", retry_failed = true)]
async fn send_digest() -> Result<(), String> {
    Ok(())
}

fn main() {}
