use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", on_error = "panic")]
async fn send_digest() -> Result<(), leasehold::Error> {
    Ok(())
}

fn main() {}
