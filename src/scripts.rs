//! The Lua scripts of `scripts/`, loaded once and run by `EVALSHA`.

use fred::clients::Client;
use fred::error::Error as RedisError;
use fred::interfaces::LuaInterface;
use fred::types::{FromValue, Key, Value};

/// One Lua script and its SHA-1.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: String,
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Script {
        Script {
            name,
            body,
            sha: fred::util::sha1_hash(body),
        }
    }

    /// Runs the script by `EVALSHA`. A server that lost its script cache (`SCRIPT FLUSH`, restart,
    /// failover) answers `NOSCRIPT`: the script is loaded again and the call made once more, which is
    /// safe because the first call did not run.
    pub(crate) async fn run<R: FromValue>(
        &self,
        client: &Client,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        let args = Value::Array(args);
        match client
            .evalsha(self.sha.as_str(), keys.clone(), args.clone())
            .await
        {
            Err(err) if err.details().starts_with("NOSCRIPT") => {
                tracing::debug!(script = self.name, "script cache was flushed, loading it again");
                let _: String = client.script_load(self.body).await?;
                client.evalsha(self.sha.as_str(), keys, args).await
            }
            other => other,
        }
    }

    async fn load(&self, client: &Client) -> Result<(), RedisError> {
        let sha: String = client.script_load(self.body).await?;
        debug_assert_eq!(sha, self.sha);
        Ok(())
    }
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
    pub(crate) async fn load_all(&self, client: &Client) -> Result<(), RedisError> {
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
