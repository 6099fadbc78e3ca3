use lease::singleton;

#[singleton(name = "digest", ttl = "90s", on_error = "panic")]
async fn send_digest() -> Result<(), lease::Error> {
    Ok(())
}

fn main() {}
