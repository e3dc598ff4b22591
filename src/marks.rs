//! The engine's side of a waiting writer's mark (see `scripts/rw_acquire.lua`): a writer that waits
//! for a read-write lock records itself in the lock's waiting writers' hash (its refused attempt
//! does, in the same script call), which holds back new readers. The mark is hosted as a hold whose
//! "lock" is that hash and whose field is the owner id, so the watchdog renews it while the writer
//! waits (a heartbeat: a crashed waiter's mark goes with its lease) and the releaser removes it when
//! the writer stops waiting, granted or not.

use std::sync::Arc;

use tokio::time::Instant;

use crate::core::Core;
use crate::hold::{next_generation, Grant};
use crate::keys::RwKeys;
use crate::Error;

impl Core {
    /// Takes over the mark that a refused write attempt of `owner` left in Redis: a grant whose
    /// guard keeps it alive. A second wait of the same owner joins it (reentrant).
    pub(crate) async fn adopt_mark(self: &Arc<Self>, rw: &RwKeys, owner: &Arc<str>) -> Result<Grant, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        let keys = Arc::new(rw.mark());
        let (hold, _ops) = self.holds.lock_hold(&keys, owner).await;
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
        self.wake_watchdog_for(deadline);
        Ok(grant)
    }
}
