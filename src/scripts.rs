//! The Lua scripts of `scripts/`, loaded once and run by `EVALSHA`.

use fred::error::Error as RedisError;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, FromValue, Key, Value};

/// One Lua script and its SHA-1.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: String,
}

/// `EVALSHA` as a custom command, so that it runs with the per-command options of the caller's
/// client (timeout, one attempt): fred's own `evalsha` does not take them.
fn evalsha() -> CustomCommand {
    // The keys start after the SHA and their count.
    CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false)
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Script {
        Script {
            name,
            body,
            sha: fred::util::sha1_hash(body),
        }
    }

    /// Runs the script by `EVALSHA`, once. A server that lost its script cache (`SCRIPT FLUSH`,
    /// restart, failover) answers `NOSCRIPT`: the script is loaded again for later calls, and the
    /// `NOSCRIPT` error is returned. This call is *not* resent: the caller decides, because a resend
    /// would run after calls sent since, which breaks the order that releases and undos rely on.
    /// (See [`is_noscript`].)
    pub(crate) async fn run<R: FromValue, C: ClientLike>(
        &self,
        client: &C,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        let mut call: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        call.push(Value::from(self.sha.as_str()));
        call.push(Value::from(keys.len() as i64));
        call.extend(keys.into_iter().map(Value::from));
        call.extend(args);
        match client.custom::<R, Value>(evalsha(), call).await {
            Err(err) if is_noscript(&err) => {
                tracing::debug!(script = self.name, "script cache was flushed, loading it again");
                self.load(client).await?;
                Err(err)
            }
            other => other,
        }
    }

    async fn load<C: ClientLike>(&self, client: &C) -> Result<(), RedisError> {
        let load = CustomCommand::new_static("SCRIPT", ClusterHash::Random, false);
        let sha: String = client
            .custom(load, vec![Value::from("LOAD"), Value::from(self.body)])
            .await?;
        if sha != self.sha {
            return Err(RedisError::new(
                fred::error::ErrorKind::Parse,
                format!("SCRIPT LOAD of {} answered {sha:?}", self.name),
            ));
        }
        Ok(())
    }
}

/// Whether a call failed because the server did not have the script: it did not run.
pub(crate) fn is_noscript(err: &RedisError) -> bool {
    err.details().starts_with("NOSCRIPT")
}

/// The batch script: the acquire and release functions, then the loop that runs them.
pub(crate) const BATCH: &str = concat!(
    include_str!("../scripts/acquire.lua"),
    include_str!("../scripts/release.lua"),
    include_str!("../scripts/batch.lua")
);

/// Every script relock runs.
pub(crate) struct Scripts {
    pub(crate) batch: Script,
    pub(crate) renew: Script,
    pub(crate) force_unlock: Script,
    pub(crate) raise_fence: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            // acquire.lua and release.lua define the functions that batch.lua runs.
            batch: Script::new("batch", BATCH),
            renew: Script::new("renew", include_str!("../scripts/renew.lua")),
            force_unlock: Script::new("force_unlock", include_str!("../scripts/force_unlock.lua")),
            raise_fence: Script::new("raise_fence", include_str!("../scripts/raise_fence.lua")),
        }
    }

    /// Loads every script into a server's cache (`SCRIPT LOAD`).
    pub(crate) async fn load_all<C: ClientLike>(&self, client: &C) -> Result<(), RedisError> {
        for script in [&self.batch, &self.renew, &self.force_unlock, &self.raise_fence] {
            script.load(client).await?;
        }
        Ok(())
    }
}

/// The scripts, hashed once per process.
pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(Scripts::new)
}
