//! What the examples share: a throwaway redis-server when no `REDIS_URL` is given.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server started from PATH on a free loopback port, killed and cleaned up on drop.
pub struct Throwaway {
    child: Child,
    dir: PathBuf,
    pub url: String,
}

impl Throwaway {
    pub fn start() -> Result<Throwaway, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!("relock-example-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("could not start redis-server from PATH ({e}); install it (e.g. `apt-get install redis-server`) or set REDIS_URL")
            })?;
        let server = Throwaway {
            child,
            dir,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not come up within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `REDIS_URL` if set, else a throwaway server (kept alive by the returned handle).
pub fn redis_url() -> Result<(String, Option<Throwaway>), String> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let server = Throwaway::start()?;
            println!(
                "REDIS_URL not set: started a throwaway redis-server at {}",
                server.url
            );
            Ok((server.url.clone(), Some(server)))
        }
    }
}
