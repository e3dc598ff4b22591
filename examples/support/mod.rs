//! What the examples share: a throwaway redis-server (`relock::testing::Server`) when no
//! `REDIS_URL` is given.
#![allow(dead_code)]

use relock::testing::Server;

/// A throwaway redis-server from `PATH`, or an error that says how to get one.
pub fn throwaway() -> Result<Server, String> {
    Server::try_start().map_err(|err| format!("{err}, or set REDIS_URL"))
}

/// `REDIS_URL` if set, else a throwaway server (kept alive by the returned handle).
pub fn redis_url() -> Result<(String, Option<Server>), String> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let server = throwaway()?;
            println!(
                "REDIS_URL not set: started a throwaway redis-server at {}",
                server.url()
            );
            Ok((server.url(), Some(server)))
        }
    }
}
