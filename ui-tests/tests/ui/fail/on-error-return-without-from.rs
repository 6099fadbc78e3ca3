use leasehold::singleton;

// `String` has no `From<leasehold::Error>`: the error cannot be converted.
#[singleton(name = "digest", ttl = "90s", on_error = "return")]
async fn send_digest() -> Result<(), String> {
    Ok(())
}

fn main() {}
