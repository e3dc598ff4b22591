//! What wakes the watchdog (`engine/watchdog.rs`) and what it is told: the core holds them, the
//! holds' code and the watchdog use them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How the watchdog is woken, and what it is told: one per client, in its core.
pub(crate) struct Signals {
    /// Wakes the watchdog: a new hold's deadline, a round asked for, shutdown, the core dropped.
    pub(crate) kick: Arc<Notify>,
    /// When the watchdog will wake next, in µs since `epoch`; `u64::MAX` while it is awake (it then
    /// sees every hold as it is). A new hold kicks it only if its deadline comes before that, so
    /// that a busy lock does not wake the watchdog per acquisition.
    wake: AtomicU64,
    /// The earliest deadline that new holds asked it to wake for since it last looked (µs since
    /// `epoch`, `u64::MAX`: none): so it learns of them without a pass over every hold.
    asked: AtomicU64,
    /// A renewal round asked for now, not at the next interval (see `testing::lose`).
    pub(crate) round_asked: AtomicBool,
    epoch: Instant,
}

impl Default for Signals {
    fn default() -> Signals {
        Signals {
            kick: Arc::new(Notify::new()),
            wake: AtomicU64::new(u64::MAX),
            asked: AtomicU64::new(u64::MAX),
            round_asked: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

impl Signals {
    /// The watchdog is awake (`None`), or will sleep until `Some(wake)`.
    pub(crate) fn set_wake(&self, wake: Option<Instant>) {
        let at = wake.map_or(u64::MAX, |wake| self.micros(wake));
        self.wake.store(at, Ordering::SeqCst);
    }

    /// Kicks the watchdog, and tells it `deadline`, if a hold that runs out then needs it sooner
    /// than it will wake. The hold's deadline is set before this is called, and the watchdog marks
    /// itself awake before it looks at what it was told and at the holds: either it sees the
    /// deadline, or this sees it awake and kicks.
    pub(crate) fn wake_for(&self, deadline: Instant) {
        let at = self.micros(deadline);
        if at < self.wake.load(Ordering::SeqCst) {
            self.asked.fetch_min(at, Ordering::SeqCst);
            self.kick.notify_one();
        }
    }

    /// The earliest deadline asked for by [`wake_for`](Signals::wake_for) since the last call.
    pub(crate) fn take_asked(&self) -> Option<Instant> {
        match self.asked.swap(u64::MAX, Ordering::SeqCst) {
            u64::MAX => None,
            at => Some(self.epoch + Duration::from_micros(at)),
        }
    }

    /// Has the watchdog start a renewal round now (or as soon as the one in flight ends), which
    /// finds holds removed behind this client's back.
    #[cfg(feature = "testing")]
    pub(crate) fn renew_now(&self) {
        self.round_asked.store(true, Ordering::SeqCst);
        self.kick.notify_one();
    }

    fn micros(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch)
            .as_micros()
            .min(u64::MAX as u128 - 1) as u64
    }
}
