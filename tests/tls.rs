//! TLS (`rediss://`, a private CA through `from_fred`) and restricted ACL users, against real
//! redis-servers: TLS-only servers with certificates made at test time, and ACL users made with
//! `ACL SETUSER`.

mod support;

use std::time::Duration;

use relock::{Error, LockClient, LockConfig, Owner};
use support::ServerExt;
use support::{lock_key, unique_name, RedisServer, Reply};
use tokio::time::Instant;

/// The command timeout of the connects that must fail; they must fail well within `PROMPT`.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const PROMPT: Duration = Duration::from_secs(2);

/// A connect that must fail: the error, after checking that it came within `PROMPT` and is not bad input.
async fn failed_connect(url: &str) -> Error {
    let start = Instant::now();
    let result = LockClient::connect_with(url, LockConfig::default().command_timeout(CONNECT_TIMEOUT)).await;
    let elapsed = start.elapsed();
    let err = match result {
        Ok(client) => {
            client.shutdown().await;
            panic!("connected to {url}");
        }
        Err(err) => err,
    };
    println!("{url}: {err} (after {elapsed:?})");
    assert!(elapsed < PROMPT, "the connect to {url} took {elapsed:?}: {err}");
    assert!(
        matches!(err, Error::Redis(_) | Error::Timeout(_) | Error::Connect { .. }),
        "{url}: {err:?}"
    );
    err
}

/// Holds a lock, re-enters it, lets a second owner wait on it and checks that the release message
/// (not the lease, `watchdog_timeout` away) wakes that waiter; then the key is gone.
async fn hold_reenter_and_hand_over(client: &LockClient, exists: impl Fn(&str) -> bool) {
    let name = unique_name("handover");
    let lock = client.lock(&name);
    let guard = lock.acquire().await.expect("acquire");
    // Drawn here (a plain lock's first read), over the same connection.
    let token = guard.fencing_token().await.expect("token");
    assert!(token > 0);
    let inner = lock.acquire().await.expect("re-enter");
    assert_eq!(inner.hold_count(), 2);
    inner.release().await.expect("inner release");
    assert!(exists(&lock_key(&name)), "still held once");
    assert!(lock.is_locked().await.expect("is_locked"));

    let waiter = tokio::spawn(Owner::new().scope({
        let lock = lock.clone();
        async move {
            let guard = lock.acquire().await.expect("the waiter acquires");
            let token = guard.fencing_token().await.expect("token");
            guard.release().await.expect("the waiter releases");
            token
        }
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    assert_eq!(guard.fencing_token().await.expect("token"), token);
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the release message did not wake the waiter")
        .expect("waiter task");
    let took = released.elapsed();
    assert!(next > token, "tokens {token} then {next}");
    // The lease had about 30 s left: only the release message explains a prompt wake-up.
    assert!(took < Duration::from_secs(5), "the waiter woke after {took:?}");
    assert!(!exists(&lock_key(&name)), "the key outlived the last release");
}

/// Holds a lock across several renewals of a short lease, then releases it.
async fn hold_across_renewals(client: &LockClient, pttl: impl Fn(&str) -> i64) {
    let name = unique_name("renewed");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    // Twice the 1.5 s lease: only renewals keep it.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(guard.is_held(), "the watchdog lost the lock");
    let ttl = pttl(&lock_key(&name));
    assert!(ttl > 0 && ttl <= 1500, "PTTL {ttl}");
    guard.release().await.expect("release");
    assert_eq!(pttl(&lock_key(&name)), -2, "the key outlived the release");
}

// ---------------------------------------------------------------------------------------------
// TLS

/// A fred client that trusts the test CA (and nothing else), configured as relock recommends.
#[cfg(feature = "tls-rustls")]
fn fred_tls_client(server: &support::tls::TlsRedisServer) -> fred::clients::Client {
    use fred::prelude::{Builder, Config, ReconnectPolicy, TlsConnector};
    use fred::rustls::pki_types::CertificateDer;
    use fred::rustls::{ClientConfig, RootCertStore};

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(server.ca_der()))
        .expect("the test CA");
    let tls = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut config = Config::from_url(&server.tls_url()).expect("url");
    config.tls = Some(TlsConnector::from(tls).into());
    Builder::from_config(config)
        .with_connection_config(|conn| conn.max_command_attempts = 1)
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
        .build()
        .expect("fred client")
}

#[cfg(feature = "tls-rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_with_a_private_ca_through_from_fred() {
    let server = support::tls::TlsRedisServer::start();
    let exists = |key: &str| server.cli(&["EXISTS", key]) == "1";
    let pttl = |key: &str| server.cli(&["PTTL", key]).parse::<i64>().expect("PTTL");

    let client = LockClient::from_fred(fred_tls_client(&server), LockConfig::default())
        .await
        .expect("connect over TLS");
    hold_reenter_and_hand_over(&client, exists).await;
    client.shutdown().await;

    let client = LockClient::from_fred(fred_tls_client(&server), support::fast_config())
        .await
        .expect("connect over TLS");
    hold_across_renewals(&client, pttl).await;
    client.shutdown().await;
}

/// `rediss://` is TLS with the certificate checked: the server's certificate, from a CA the system
/// does not trust, is refused at connect, and the error says why.
#[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_checks_the_server_certificate() {
    let server = support::tls::TlsRedisServer::start();
    let err = failed_connect(&server.tls_url()).await;
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_to_a_plaintext_port_fails_promptly_and_sends_no_command() {
    let server = RedisServer::start();
    let err = failed_connect(&format!("rediss://127.0.0.1:{}", server.port())).await;
    assert!(
        matches!(&err, Error::Connect { reason, .. } if reason.contains("TLS")),
        "no word about TLS: {err}"
    );
    // Had the client fallen back to plaintext, the server would have run its commands.
    let Reply::Str(stats) = server.cmd(&["INFO", "commandstats"]) else {
        panic!("INFO");
    };
    for command in [
        "cmdstat_script",
        "cmdstat_evalsha",
        "cmdstat_fcall",
        "cmdstat_function",
        "cmdstat_info",
    ] {
        assert!(!stats.contains(command), "the server ran {command}:\n{stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_a_tls_only_server_fails_promptly() {
    let server = support::tls::TlsRedisServer::start();
    failed_connect(&server.plain_url()).await;
    // The server is fine: a TLS client gets through.
    assert_eq!(server.cli(&["PING"]), "PONG");
}

/// `rediss://` works out of the box with a CA the process trusts. The trust store is the process's
/// environment (`SSL_CERT_FILE`), so this runs [`rediss_child`] in a child process of this test binary.
#[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_url_connects_to_a_server_the_system_trusts() {
    let server = support::tls::TlsRedisServer::start();
    let output = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["rediss_child", "--exact", "--ignored", "--nocapture"])
        .env("SSL_CERT_FILE", server.ca_pem_path())
        .env("RELOCK_TLS_CHILD_URL", server.tls_url())
        .output()
        .await
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("rediss child: held"), "{stdout}");
}

/// Run by [`rediss_url_connects_to_a_server_the_system_trusts`] only, in its own process.
#[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by rediss_url_connects_to_a_server_the_system_trusts, with the test CA trusted"]
async fn rediss_child() {
    let url = std::env::var("RELOCK_TLS_CHILD_URL").expect("RELOCK_TLS_CHILD_URL");
    let client = LockClient::connect_with(&url, support::fast_config())
        .await
        .expect("connect with rediss://");
    let guard = client
        .lock(&unique_name("child"))
        .acquire()
        .await
        .expect("acquire");
    assert!(guard.is_held());
    guard.release().await.expect("release");
    client.shutdown().await;
    println!("rediss child: held and released");
}

/// Without a TLS feature, `rediss://` (in any form) is refused before any I/O instead of connecting
/// in plaintext.
#[cfg(not(any(feature = "tls-rustls", feature = "tls-native")))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tls_feature_rediss_is_refused_before_any_io() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    for scheme in ["rediss", "REDISS", "rediss-cluster", "rediss-sentinel", "valkeys"] {
        let url = format!("{scheme}://127.0.0.1:{port}");
        match LockClient::connect(&url).await {
            Err(Error::InvalidConfig(message)) => {
                assert!(message.contains("built without TLS"), "{url}: {message}")
            }
            Err(other) => panic!("{url}: {other:?}"),
            Ok(_) => panic!("{url}: connected without TLS"),
        }
        match relock::MultiLock::connect(&[&url], LockConfig::default()).await {
            Err(Error::InvalidConfig(message)) => {
                assert!(message.contains("built without TLS"), "{url}: {message}")
            }
            Err(other) => panic!("MultiLock {url}: {other:?}"),
            Ok(_) => panic!("MultiLock {url}: connected without TLS"),
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection was made"
    );
    // redis:// still works.
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.expect("redis://");
    client.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// ACL users

/// The smallest ACL that relock needs, as the README gives it (after `ACL SETUSER <user> on >pw`).
const MINIMAL_ACL: &[&str] = &[
    "resetkeys",
    "~relock:*",
    "resetchannels",
    "&relock:*",
    "-@all",
    "+evalsha",
    "+script|load",
    "+fcall",
    "+function|load",
    "+info",
    "+exists",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    // Sent by fred at every connect.
    "+client|id",
    // Names relock's connections (`LockConfig::client_name`).
    "+client|setname",
    // Run by the scripts.
    "+hexists",
    "+hget",
    "+hkeys",
    "+hset",
    "+hdel",
    "+pexpire",
    "+pttl",
    "+get",
    "+set",
    "+del",
    "+type",
    "+time",
    "+publish",
];

/// Makes the user `name` with password `pw` and `rules`; its URL.
fn acl_user(server: &RedisServer, name: &str, rules: &[&str]) -> String {
    let mut args = vec!["ACL", "SETUSER", name, "reset", "on", ">pw"];
    args.extend_from_slice(rules);
    assert_eq!(server.cmd(&args), Reply::Str("OK".into()), "{args:?}");
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

fn with(rules: &[&'static str]) -> Vec<&'static str> {
    MINIMAL_ACL.iter().chain(rules).copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimal_acl_user_can_do_everything() {
    let server = RedisServer::start();
    let url = acl_user(&server, "locker", MINIMAL_ACL);
    let exists = |key: &str| server.exists(key);
    let pttl = |key: &str| server.cmd(&["PTTL", key]).as_int().expect("PTTL");

    let client = LockClient::connect_with(&url, LockConfig::default())
        .await
        .expect("connect as the minimal user");
    hold_reenter_and_hand_over(&client, exists).await;
    let name = unique_name("forced");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    assert!(client.lock(&name).force_unlock().await.expect("force_unlock"));
    assert!(!server.exists(&lock_key(&name)));
    drop(guard);
    client.shutdown().await;

    let client = LockClient::connect_with(&url, support::fast_config())
        .await
        .expect("connect as the minimal user");
    hold_across_renewals(&client, pttl).await;
    client.shutdown().await;

    // The user was never refused anything: no ACL failure is logged.
    let Reply::Array(log) = server.cmd(&["ACL", "LOG"]) else {
        panic!("ACL LOG");
    };
    assert!(log.is_empty(), "ACL LOG: {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_denied_evalsha_fails_at_connect() {
    let server = RedisServer::start();
    let url = acl_user(&server, "noeval", &with(&["-evalsha"]));
    let err = failed_connect(&url).await.to_string();
    assert!(err.contains("NOPERM") && err.contains("evalsha"), "{err}");

    let url = acl_user(&server, "noscript", &with(&["-script|load"]));
    let err = failed_connect(&url).await.to_string();
    assert!(err.contains("NOPERM") && err.contains("script"), "{err}");
}

/// A user without `FCALL` and `FUNCTION LOAD` (the minimal ACL of relock before it ran a function
/// library) works as before: the batch scripts run by `EVALSHA`, and no library is left on the
/// server. So does one allowed `FCALL` but not `FUNCTION LOAD`, on a server without the library. And
/// a user who loses either while connected: when the server lost the library (`FUNCTION FLUSH`),
/// the refused reload turns the node to `EVALSHA`; a refused `FCALL` does the same. Each time the
/// call that found the function missing or refused is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_functions_runs_the_scripts() {
    let server = RedisServer::start();
    for (user, denied) in [
        ("nofunctions", &["-fcall", "-function|load"][..]),
        ("noload", &["-function|load"][..]),
    ] {
        let url = acl_user(&server, user, &with(denied));
        let client = LockClient::connect_with(&url, LockConfig::default())
            .await
            .expect("connect without functions");
        let fcalls = server.command_calls("fcall");
        let exists = |key: &str| server.exists(key);
        hold_reenter_and_hand_over(&client, exists).await;
        assert_eq!(
            server.command_calls("fcall"),
            fcalls,
            "{user}: FCALL after the connect check"
        );
        assert!(support::function_libraries(&server).is_empty(), "{user}");
        client.shutdown().await;
    }

    for (user, denied, flush) in [
        ("loseslibrary", &["-function|load"][..], true),
        ("losesfcall", &["-fcall"][..], false),
    ] {
        let url = acl_user(&server, user, MINIMAL_ACL);
        let client = LockClient::connect_with(&url, LockConfig::default())
            .await
            .expect("connect");
        let name = unique_name("refused");
        let lock = client.lock(&name);
        lock.acquire()
            .await
            .expect("acquire")
            .release()
            .await
            .expect("release");
        assert!(
            !support::function_libraries(&server).is_empty(),
            "{user}: no library loaded"
        );
        acl_user(&server, user, &with(denied));
        if flush {
            server.cmd(&["FUNCTION", "FLUSH"]);
        }
        let scripts = server.command_calls("evalsha");
        let guard = lock
            .acquire()
            .await
            .expect("acquire after the function was refused");
        assert!(guard.fencing_token().await.expect("token") > 0);
        guard.release().await.expect("release");
        assert!(!server.exists(&lock_key(&name)), "{user}");
        // The acquisition (the release, alone, is an `HDEL`: no script).
        assert!(
            server.command_calls("evalsha") > scripts,
            "{user}: not run by script"
        );
        client.shutdown().await;
    }
}

/// The connect check's error for a refused `SUBSCRIBE`: the server's `NOPERM`, or (when fred dropped
/// that reply, which it does not wait for) the finding that the subscription did not take.
fn subscribe_refused(err: &str) -> bool {
    err.contains("SUBSCRIBE to the channel relock:{}:released")
        && (err.contains("NOPERM") || err.contains("was refused"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_denied_the_keys_or_channels_fails_at_connect() {
    let server = RedisServer::start();
    // Keys of another prefix only.
    let rules: Vec<&str> = with(&["resetkeys", "~other:*"]);
    let url = acl_user(&server, "otherkeys", &rules);
    let err = failed_connect(&url).await.to_string();
    assert!(err.contains("NOPERM") && err.contains("relock:{}"), "{err}");

    // No channel at all.
    let url = acl_user(&server, "nochannels", &with(&["resetchannels"]));
    let err = failed_connect(&url).await.to_string();
    assert!(subscribe_refused(&err), "{err}");

    // Channels allowed, but not SUBSCRIBE; nor PING, which checks the subscription.
    let url = acl_user(&server, "nosubscribe", &with(&["-subscribe"]));
    let err = failed_connect(&url).await.to_string();
    assert!(subscribe_refused(&err), "{err}");
    let url = acl_user(&server, "noping", &with(&["-ping"]));
    let err = failed_connect(&url).await.to_string();
    assert!(err.contains("NOPERM") && err.contains("ping"), "{err}");

    // A prefix of the user's own works once the ACL names it.
    let rules = with(&["~jobs:*", "&jobs:*"]);
    let url = acl_user(&server, "jobs", &rules);
    let client = LockClient::connect_with(&url, LockConfig::default().key_prefix("jobs"))
        .await
        .expect("connect with the user's prefix");
    let guard = client.lock("a").acquire().await.expect("acquire");
    assert!(server.exists("jobs:{a}"));
    guard.release().await.expect("release");
    client.shutdown().await;
}
