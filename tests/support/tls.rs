//! A throwaway TLS-only redis-server (`--port 0 --tls-port P`) with a CA and a server certificate
//! made at test time by the `openssl` CLI, and `redis-cli --tls` for its administration.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A TLS-only redis-server of this test alone, killed and cleaned up (with its certificates) on drop.
pub struct TlsRedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl TlsRedisServer {
    /// Makes a CA and a certificate for `127.0.0.1` and `localhost` signed by it, and starts a server
    /// that speaks only TLS on a free port (clients need no certificate of their own).
    pub fn start() -> TlsRedisServer {
        let dir = std::env::temp_dir().join(format!(
            "relock-tls-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        make_certificates(&dir);
        for _ in 0..20 {
            let mut server = TlsRedisServer {
                child: None,
                port: super::free_port(),
                dir: dir.clone(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start a TLS redis-server on a free port");
    }

    fn spawn(&mut self) -> bool {
        let dir = &self.dir;
        let args: Vec<std::ffi::OsString> = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            self.port.to_string().into(),
            "--tls-cert-file".into(),
            dir.join("server.crt").into(),
            "--tls-key-file".into(),
            dir.join("server.key").into(),
            "--tls-ca-cert-file".into(),
            dir.join("ca.crt").into(),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let ready = || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                && self.try_cli(&["PING"]).is_some_and(|reply| reply == "PONG")
        };
        self.child = super::spawn_redis(dir, self.port, &args, ready);
        self.child.is_some()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://127.0.0.1:port`.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:port`: plaintext to a port that speaks only TLS.
    pub fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The test CA's certificate, PEM.
    pub fn ca_pem_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The test CA's certificate, DER (what rustls's root store takes).
    pub fn ca_der(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.der")).expect("ca.der")
    }

    /// Runs one command through `redis-cli --tls`, trusting the test CA; panics on failure.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli --tls {args:?} on port {} failed", self.port))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(self.dir.join("ca.crt"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ca.crt`/`ca.key` (a self-signed CA), `ca.der`, and `server.crt`/`server.key` for `127.0.0.1` and
/// `localhost`, signed by the CA; EC P-256, valid for two days.
fn make_certificates(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\n\
         extendedKeyUsage = serverAuth\n",
    )
    .expect("server.ext");
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!("req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=relock-test-CA"),
    );
    openssl(dir, "x509 -in ca.crt -outform der -out ca.der");
    openssl(
        dir,
        &format!("req {ec} -keyout server.key -out server.csr -subj /CN=localhost"),
    );
    openssl(
        dir,
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
         -extfile server.ext -out server.crt",
    );
    for file in ["ca.crt", "ca.der", "server.crt", "server.key"] {
        assert!(dir.join(file).exists(), "openssl made no {file}");
    }
}

/// Runs `openssl` with `args` (split at whitespace) in `dir`; panics on failure.
fn openssl(dir: &Path, args: &str) {
    let output = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl must be on PATH");
    assert!(
        output.status.success(),
        "openssl {args} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
