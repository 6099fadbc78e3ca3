use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", once_per = "1h", retry_failed = "yes")]
async fn send_digest() -> Result<(), String> {
    Ok(())
}

fn main() {}
