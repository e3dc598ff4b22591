//! The Lua scripts of `scripts/`, loaded once and run by `EVALSHA`; the batch script also as a
//! function of relock's own library, run by `FCALL` where the server has it (see [`Library`]).

use fred::bytes_utils::Str;
use fred::error::Error as RedisError;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, FromValue, Key, Value};

/// One Lua script and its SHA-1.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    /// Shared bytes: each call's argument is a clone without a copy.
    sha: Str,
    /// A batch script: [`Library`]'s function runs the same calls where the server has it.
    pub(crate) batch: bool,
}

/// `EVALSHA` as a custom command, so that it runs with the per-command options of the caller's
/// client (timeout, one attempt): fred's own `evalsha` does not take them. Routed by the slot of
/// its keys (fred would hash the first argument, the SHA, for a custom command).
fn evalsha(slot: u16) -> CustomCommand {
    CustomCommand::new_static("EVALSHA", ClusterHash::Custom(slot), false)
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Script {
        Script {
            name,
            body,
            sha: Str::from(fred::util::sha1_hash(body)),
            batch: false,
        }
    }

    /// A batch script (see [`Script::batch`]).
    fn batch(name: &'static str, body: &'static str) -> Script {
        Script {
            batch: true,
            ..Script::new(name, body)
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
        // Where the keys live: a cluster primary that lost the script gets it back.
        let slot = slot_of(&keys);
        let call = call_args(&self.sha, keys, args);
        crate::util::telemetry::redis_call(self.name);
        match client.custom::<R, Value>(evalsha(slot), call).await {
            Err(err) if is_noscript(&err) => {
                tracing::debug!(script = self.name, "script cache was flushed, loading it again");
                self.load(client, ClusterHash::Custom(slot)).await?;
                Err(err)
            }
            other => other,
        }
    }

    /// `SCRIPT LOAD`, on a cluster to the primary `route` names (ignored elsewhere, and where the
    /// client's options name a node).
    async fn load<C: ClientLike>(&self, client: &C, route: ClusterHash) -> Result<(), RedisError> {
        let load = CustomCommand::new_static("SCRIPT", route, false);
        let sha: String = client
            .custom(load, vec![Value::from("LOAD"), Value::from(self.body)])
            .await?;
        if *sha != *self.sha {
            return Err(RedisError::new(
                fred::error::ErrorKind::Parse,
                format!("SCRIPT LOAD of {} answered {sha:?}", self.name),
            ));
        }
        Ok(())
    }
}

/// Whether a call failed because the server did not have the script (`NOSCRIPT`) or relock's
/// function, or refused the function (see [`not_run_by_function`]): it did not run.
pub(crate) fn is_noscript(err: &RedisError) -> bool {
    let details = err.details();
    details.starts_with("NOSCRIPT") || details.starts_with(REFUSED_FUNCTION) || is_function_missing(err)
}

/// The start of the error of an `FCALL` that the server refused (see [`not_run_by_function`]).
const REFUSED_FUNCTION: &str = "relock's function was refused, not run: ";

/// The error of an `FCALL` refused before it ran, for the caller to make again (by script): the
/// server's own text is no mark of that (a script's write refused out of memory answers the same
/// `OOM` as a function refused up front).
pub(crate) fn not_run_by_function(err: &RedisError) -> RedisError {
    RedisError::new(err.kind().clone(), format!("{REFUSED_FUNCTION}{}", err.details()))
}

/// Whether an `FCALL` failed because the server does not have the function.
pub(crate) fn is_function_missing(err: &RedisError) -> bool {
    err.details().starts_with("ERR Function not found")
}

/// Whether an `FCALL` or `FUNCTION LOAD` was refused for good: to the user (an ACL without them:
/// `NOPERM`, the command named), or by a server without functions (before Redis 7.0).
pub(crate) fn is_function_refused(err: &RedisError) -> bool {
    let details = err.details().to_ascii_lowercase();
    (details.starts_with("noperm")
        && (details.contains("'fcall' command") || details.contains("'function|load' command")))
        || details.contains("unknown command 'fcall'")
        || details.contains("unknown command 'function'")
}

/// The arguments of `EVALSHA` or `FCALL`: the script's SHA or the function's name, the number of
/// keys, the keys, the arguments.
fn call_args(script: &Str, keys: Vec<Key>, args: Vec<Value>) -> Vec<Value> {
    let mut call: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
    call.push(Value::String(script.clone()));
    call.push(Value::from(keys.len() as i64));
    call.extend(keys.into_iter().map(Value::from));
    call.extend(args);
    call
}

/// The slot of a call's first key (every key of a call is in one slot): where a cluster runs it.
pub(crate) fn slot_of(keys: &[Key]) -> u16 {
    keys.first().map_or(0, |key| {
        fred::types::cluster::ClusterRouting::hash_key(key.as_bytes())
    })
}

/// relock's Redis Functions library (Redis 7.0 and later): the batch script's functions, defined
/// once per server, and one function that runs a batch (`batch.lua`) with the batch script's keys,
/// arguments and reply.
///
/// Why: every call of a script runs its whole text, so a call of the batch script first defines
/// each of its Lua functions anew. A function of a library calls functions defined when the
/// library was loaded. Alternated with the scripts on one server, it saved 4-6 % of
/// the server's CPU per lock cycle.
///
/// The library's name and its function's carry a hash of the library's code, so that clients of
/// different relock versions on one server each find their own. It is loaded by `FUNCTION LOAD`
/// when a node connects (see `Node::init`), stays on the server (in its RDB and AOF, and on its
/// replicas) and is loaded again where a call finds it missing (a restart without persistence,
/// `FUNCTION FLUSH`). Where the server has no functions (before 7.0) or the user may not load or
/// call them, the node runs the batch scripts by `EVALSHA` instead, and also from the first call
/// that a server out of memory refuses: a function without flags is refused whole (`OOM`), where
/// a script is refused only at its first write that needs memory, so its releases still run.
pub(crate) struct Library {
    /// The function: `relock_batch_` and the code's hash.
    function: Str,
    code: String,
}

impl Library {
    fn new() -> Library {
        // batch.lua is the body of the function: KEYS and ARGV are its arguments, as the script's
        // globals are. The hash is of the code with a placeholder for itself.
        let template = format!(
            "#!lua name=relock_#\n{BATCH_FUNCTIONS}\nredis.register_function('relock_batch_#', \
             function(KEYS, ARGV)\n{BATCH_LOOP}\nend)\n"
        );
        let hash = &fred::util::sha1_hash(&template)[..16];
        let code = template
            .replacen("name=relock_#", &format!("name=relock_{hash}"), 1)
            .replacen("'relock_batch_#'", &format!("'relock_batch_{hash}'"), 1);
        Library {
            function: Str::from(format!("relock_batch_{hash}")),
            code,
        }
    }

    /// `FUNCTION LOAD`, on a cluster to the primary `route` names (see [`Script::load`]). A library of
    /// the same name is the same code: already there counts as loaded.
    pub(crate) async fn load<C: ClientLike>(&self, client: &C, route: ClusterHash) -> Result<(), RedisError> {
        let load = CustomCommand::new_static("FUNCTION", route, false);
        match client
            .custom::<Value, Value>(load, vec![Value::from("LOAD"), Value::from(self.code.as_str())])
            .await
        {
            Err(err) if err.details().contains("already exists") => Ok(()),
            Err(err) => Err(err),
            Ok(_) => Ok(()),
        }
    }

    /// Runs the function once with no operations, after loading the library if the server does not
    /// have it: whether this server (and user) can run the batch as a function. The client's
    /// options name the server on a cluster.
    pub(crate) async fn install<C: ClientLike>(&self, client: &C) -> Result<(), RedisError> {
        let empty = || async {
            let fcall = CustomCommand::new_static("FCALL", ClusterHash::Random, false);
            let args = vec![
                Value::String(self.function.clone()),
                Value::from(0),
                Value::from(0),
                Value::from_static_str("PUBLISH"),
            ];
            client.custom::<Value, Value>(fcall, args).await
        };
        match empty().await {
            Err(err) if is_function_missing(&err) => {
                self.load(client, ClusterHash::Random).await?;
                empty().await.map(drop)
            }
            other => other.map(drop),
        }
    }

    /// Runs the function (`FCALL`) once, routed to `slot` (that of its keys, see [`slot_of`]): the
    /// same keys, arguments and reply as a call of the batch script. A server without the function
    /// answers an error [`is_noscript`] knows (the caller loads the library again). Not resent, as
    /// [`Script::run`] is not.
    pub(crate) async fn call<R: FromValue, C: ClientLike>(
        &self,
        client: &C,
        slot: u16,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        let call = call_args(&self.function, keys, args);
        crate::util::telemetry::redis_call("batch");
        let fcall = CustomCommand::new_static("FCALL", ClusterHash::Custom(slot), false);
        client.custom::<R, Value>(fcall, call).await
    }
}

/// The library, built once per process.
pub(crate) fn library() -> &'static Library {
    static LIBRARY: std::sync::OnceLock<Library> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(Library::new)
}

/// Whether a call was redirected (`MOVED`, `ASK`) by a cluster during resharding or after a
/// failover: it did not run. relock's requests allow fred no redirections (see `Node`): fred would
/// follow one only by spending a write attempt, and allowing more attempts would also let it resend
/// requests whose replies were lost. fred has updated its slot map (`MOVED`) by the time this error
/// arrives, so the caller's next try goes where the slot lives.
pub(crate) fn is_redirect(err: &RedisError) -> bool {
    *err.kind() == fred::error::ErrorKind::Routing && err.details().contains("redirections")
}

/// Whether a call did not run and may be made again: the script was missing or the slot elsewhere.
pub(crate) fn not_run(err: &RedisError) -> bool {
    is_noscript(err) || is_redirect(err)
}

/// A script file of `scripts/` with `prelude.lua`'s helpers before it.
macro_rules! with_prelude {
    ($file:literal) => {
        concat!(
            include_str!("../../scripts/prelude.lua"),
            include_str!(concat!("../../scripts/", $file))
        )
    };
}

/// The functions of the batch script: the shared helpers and the functions of every operation.
macro_rules! batch_functions {
    () => {
        concat!(
            include_str!("../../scripts/prelude.lua"),
            include_str!("../../scripts/acquire.lua"),
            include_str!("../../scripts/release.lua"),
            include_str!("../../scripts/rw_read.lua"),
            include_str!("../../scripts/rw_write.lua"),
            include_str!("../../scripts/rw_write_release.lua"),
            include_str!("../../scripts/rw_unmark.lua"),
            include_str!("../../scripts/fair_acquire.lua"),
            include_str!("../../scripts/fair_release.lua"),
            include_str!("../../scripts/fair_leave.lua"),
            include_str!("../../scripts/transfer.lua"),
            include_str!("../../scripts/transfer_granted.lua"),
        )
    };
}

/// The functions of the batch script (see [`Library`]).
const BATCH_FUNCTIONS: &str = batch_functions!();

/// The loop of the batch script, which runs the functions.
const BATCH_LOOP: &str = include_str!("../../scripts/batch.lua");

/// The batch script: the shared helpers, the functions of every operation, then the loop that runs
/// them.
pub(crate) const BATCH: &str = concat!(batch_functions!(), include_str!("../../scripts/batch.lua"));

/// The batch script for plain locks only (operations `a`, `q`, `r`, `p`, `t`, `u`): the same loop with only
/// the functions those run. Every call of a script defines all its functions anew, so leaving out
/// the read-write and fair locks' saves the server about half a microsecond per call (the common
/// calls are plain).
pub(crate) const BATCH_PLAIN: &str = concat!(
    include_str!("../../scripts/prelude.lua"),
    include_str!("../../scripts/acquire.lua"),
    include_str!("../../scripts/release.lua"),
    include_str!("../../scripts/transfer.lua"),
    include_str!("../../scripts/transfer_granted.lua"),
    include_str!("../../scripts/batch.lua")
);

/// Every script relock runs.
pub(crate) struct Scripts {
    pub(crate) batch: Script,
    pub(crate) batch_plain: Script,
    pub(crate) renew: Script,
    pub(crate) force_unlock: Script,
    pub(crate) raise_fence: Script,
    pub(crate) draw_token: Script,
    pub(crate) guarded: Script,
    pub(crate) election_leader: Script,
    pub(crate) inspect: Script,
    pub(crate) latch_set: Script,
    pub(crate) latch_count_down: Script,
    pub(crate) latch_count: Script,
    pub(crate) semaphore_acquire: Script,
    pub(crate) semaphore_available: Script,
    pub(crate) lock_all: Script,
    pub(crate) rw_state: Script,
    pub(crate) rw_force_unlock: Script,
    pub(crate) inspect_semaphore: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            // acquire.lua and release.lua define the functions that batch.lua runs.
            batch: Script::batch("batch", BATCH),
            // The same name in figures and logs: which batch script ran is a detail.
            batch_plain: Script::batch("batch", BATCH_PLAIN),
            renew: Script::new("renew", include_str!("../../scripts/renew.lua")),
            force_unlock: Script::new("force_unlock", with_prelude!("force_unlock.lua")),
            raise_fence: Script::new("raise_fence", include_str!("../../scripts/raise_fence.lua")),
            draw_token: Script::new("draw_token", with_prelude!("draw_token.lua")),
            // Loaded at its first use (a NOSCRIPT reply): most clients never make one.
            guarded: Script::new("guarded", include_str!("../../scripts/guarded.lua")),
            election_leader: Script::new(
                "election_leader",
                include_str!("../../scripts/election_leader.lua"),
            ),
            inspect: Script::new("inspect", include_str!("../../scripts/inspect.lua")),
            latch_set: Script::new("latch_set", with_prelude!("latch_set.lua")),
            latch_count_down: Script::new("latch_count_down", with_prelude!("latch_count_down.lua")),
            latch_count: Script::new("latch_count", with_prelude!("latch_count.lua")),
            semaphore_acquire: Script::new("semaphore_acquire", with_prelude!("semaphore_acquire.lua")),
            semaphore_available: Script::new("semaphore_available", with_prelude!("semaphore_available.lua")),
            // acquire.lua defines the function that lock_all.lua runs per lock.
            lock_all: Script::new(
                "lock_all",
                concat!(
                    include_str!("../../scripts/prelude.lua"),
                    include_str!("../../scripts/acquire.lua"),
                    include_str!("../../scripts/lock_all.lua")
                ),
            ),
            rw_state: Script::new("rw_state", include_str!("../../scripts/rw_state.lua")),
            rw_force_unlock: Script::new("rw_force_unlock", with_prelude!("rw_force_unlock.lua")),
            inspect_semaphore: Script::new(
                "inspect_semaphore",
                include_str!("../../scripts/inspect_semaphore.lua"),
            ),
        }
    }

    /// Loads every script into a server's cache (`SCRIPT LOAD`): the client's options name the
    /// server on a cluster.
    pub(crate) async fn load_all<C: ClientLike>(&self, client: &C) -> Result<(), RedisError> {
        for script in [
            &self.batch,
            &self.batch_plain,
            &self.renew,
            &self.force_unlock,
            &self.raise_fence,
            &self.draw_token,
            &self.inspect,
            &self.latch_set,
            &self.latch_count_down,
            &self.latch_count,
            &self.semaphore_acquire,
            &self.semaphore_available,
            &self.lock_all,
            &self.rw_state,
            &self.rw_force_unlock,
            &self.inspect_semaphore,
        ] {
            script.load(client, ClusterHash::Random).await?;
        }
        Ok(())
    }
}

/// The scripts, hashed once per process.
pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(Scripts::new)
}
