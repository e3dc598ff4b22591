//! The engine's side of a waiter's mark: what a refused attempt of a waiter leaves in Redis, in the
//! same script call, to be kept while it waits. A writer waiting for a read-write lock records itself
//! in the lock's waiting writers' hash, which holds back new readers (`scripts/rw_read.lua`); a
//! waiter of a fair lock takes its place in the queue, with a waiter key of its own
//! (`scripts/fair_acquire.lua`). The mark is hosted as a hold whose "lock" is that hash or key and whose
//! field is the owner id, so the watchdog renews it while the owner waits (a heartbeat: a crashed
//! waiter's mark goes with its lease) and the releaser removes it when the owner stops waiting,
//! granted or not.

use fred::bytes_utils::Str;
use std::sync::Arc;

use tokio::time::Instant;

use crate::engine::core::Core;
use crate::engine::hold::{next_generation, Grant};
use crate::redis::keys::LockKeys;
use crate::Error;

impl Core {
    /// Takes over the mark (`keys`, of kind `Mark` or `Waiter`) that a refused attempt of `owner`
    /// left in Redis: a grant whose guard keeps it alive. A second wait of the same owner joins it
    /// (reentrant).
    pub(crate) async fn adopt_mark(self: &Arc<Self>, keys: LockKeys, owner: &Str) -> Result<Grant, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        let keys = Arc::new(keys);
        let (hold, _ops) = self.open_hold(&keys, owner).await?;
        let lease = self.config.get_watchdog_timeout();
        let deadline = Instant::now() + lease.saturating_sub(self.masters.config.drift(lease));
        let mut st = hold.state.lock();
        if st.active() {
            st.count += 1;
            st.confirmed = None;
            return Ok(Grant::of(&hold, &st));
        }
        hold.start(&mut st, next_generation(), owner.clone());
        st.token = 0;
        st.lease = lease;
        st.watchdog = true;
        st.deadline = deadline;
        let grant = Grant::of(&hold, &st);
        drop(st);
        self.watchdog.wake_for(deadline);
        Ok(grant)
    }
}
