//! How a node's direct requests are made: a script call made again while it did not run, writes
//! that replicas confirm, and the bound around every request.

use std::time::Duration;

use fred::types::{Key, Value};

use super::Node;
use crate::redis::link::{Reply, RetryPause};
use crate::redis::scripts::{not_run, Script};
use crate::Error;

impl Node {
    /// Runs a script directly (not batched), again while it did not run (see
    /// [`run_batched`](Node::run_batched)); the caller bounds it. These calls (renew, raise the
    /// fence, force-unlock) are idempotent, and none must stay in order with another of the same
    /// hold (a renewal names its hold's generation).
    pub(super) async fn script<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, fred::error::Error> {
        until_run(|| script.run(&self.link.cmd, keys.clone(), args.clone())).await
    }

    /// [`script`](Node::script) as a write that replicas confirm, when writes are synced.
    pub(super) async fn script_synced<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<Reply<R>, fred::error::Error> {
        let mut replies = self.scripts_synced(script, vec![(keys, args)]).await?;
        replies.pop().unwrap_or_else(|| {
            Err(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                "no reply",
            ))
        })
    }

    /// Several calls of a script at once as writes that replicas confirm (see
    /// [`NodeClient::call_many`](crate::redis::link::NodeClient::call_many)), each made again while
    /// it did not run (see [`run_batched`](Node::run_batched)); the caller bounds them. One reply
    /// per call.
    pub(super) async fn scripts_synced<R: fred::types::FromValue>(
        &self,
        script: &Script,
        calls: Vec<(Vec<Key>, Vec<Value>)>,
    ) -> Result<Vec<Result<Reply<R>, fred::error::Error>>, fred::error::Error> {
        let mut out: Vec<Option<Result<Reply<R>, fred::error::Error>>> = calls.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut pause = RetryPause::new();
        loop {
            let batch = pending.iter().map(|&i| calls[i].clone()).collect();
            let replies = self.link.call_many(script, batch).await;
            let mut again = Vec::new();
            for (i, reply) in pending.into_iter().zip(replies) {
                match reply {
                    Err(err) if not_run(&err) => again.push(i),
                    other => out[i] = Some(other),
                }
            }
            if again.is_empty() {
                return Ok(out.into_iter().flatten().collect());
            }
            pending = again;
            pause.wait().await;
        }
    }

    /// The one place that bounds a direct request: fred's per-command timeout (see `cmd`), and a
    /// backstop a little later in case fred's timer is late.
    pub(super) async fn bounded<R>(
        &self,
        request: impl std::future::Future<Output = Result<R, fred::error::Error>>,
    ) -> Result<R, Error> {
        let bound = self.link.bound();
        match tokio::time::timeout(bound + BACKSTOP, request).await {
            Ok(outcome) => outcome.map_err(|err| self.link.redis_error(err)),
            Err(_) => Err(Error::Timeout(bound)),
        }
    }

    /// [`bounded`](Node::bounded) for a request about `key`, telling a key of another type apart.
    pub(super) async fn bounded_on<R>(
        &self,
        request: impl std::future::Future<Output = Result<R, fred::error::Error>>,
        key: &str,
    ) -> Result<R, Error> {
        match self.bounded(request).await {
            Err(Error::Redis(err)) => Err(Error::from_redis(err, key)),
            other => other,
        }
    }
}

/// How much later than fred's own timeout a request is abandoned by relock's backstop.
const BACKSTOP: Duration = Duration::from_millis(20);

/// A request made again, after a pause, while it answers that it did not run (see `not_run`).
/// Boxed: fred's command future (about 7 KB) held inline would be held again by every future above
/// this one that takes it as an argument (`bounded_on`'s callers held 22 KB for one semaphore
/// attempt, and moved it at every level). The semaphore row of `--quick --only family`,
/// alternated twice: 174-187 µs of client CPU per section against 236-250.
pub(super) async fn until_run<R, F>(mut request: impl FnMut() -> F) -> Result<R, fred::error::Error>
where
    F: std::future::Future<Output = Result<R, fred::error::Error>>,
{
    let mut pause = RetryPause::new();
    loop {
        match Box::pin(request()).await {
            Err(err) if not_run(&err) => pause.wait().await,
            other => return other,
        }
    }
}
