use lease::singleton;

// `String` has no `From<lease::Error>`: the error cannot be converted.
#[singleton(name = "digest", ttl = "90s", on_error = "return")]
async fn send_digest() -> Result<(), String> {
    Ok(())
}

fn main() {}
