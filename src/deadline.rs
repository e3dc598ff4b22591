//! Bounds for requests without a timer per request.
//!
//! A tokio timer that becomes the runtime's earliest makes tokio wake a parked worker to re-arm
//! its sleep. One timer per lock operation (fred's per-command timeout, relock's own bounds) did
//! that on nearly every operation after the runtime had gone idle for a moment: on a 2-vCPU machine
//! the hot-lock bench's handoff gap doubled (see the README's performance section).
//!
//! [`Deadlines`] keeps the bounds of requests in one queue and one task sleeps until the earliest;
//! a request that runs past its deadline is dropped there. Bounds of one `Deadlines` are nearly
//! always the same length, so deadlines arrive in order and the queue is kept sorted cheaply:
//! registering is a push (a shorter bound is moved forward to its place), and entries of requests
//! that finished are popped from the front as new ones come. The task wakes only when the earliest
//! deadline comes, or when a new one is earlier than its alarm.
//!
//! The task stops when its `Deadlines` is dropped.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, FutureExt};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long the task sleeps with nothing to watch (it is woken for anything new).
const IDLE: Duration = Duration::from_secs(3600);

/// A queue of deadlines, and the task that enforces them (see the module doc).
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// A deadline earlier than the task's alarm was added, or the `Deadlines` is gone.
    wake: Notify,
}

struct State {
    /// Deadlines in order, each with the abort handle of its request (aborted once the request
    /// finished or was dropped, as well as at its deadline).
    queue: VecDeque<(Instant, AbortHandle)>,
    /// When the task wakes next (`None`: it sleeps until woken). A later deadline needs no wake-up:
    /// the task looks at the queue again then. So a steady stream of requests costs the task about
    /// one wake-up per bound's length, and no timer of its own.
    alarm: Option<Instant>,
}

impl Deadlines {
    /// Starts the task; inside a tokio runtime.
    pub(crate) fn start() -> Deadlines {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                alarm: None,
            }),
            wake: Notify::new(),
        });
        tokio::spawn(run(Arc::downgrade(&shared)));
        Deadlines { shared }
    }

    /// Runs `request` until `deadline`: `None` if the deadline came first (the request is dropped).
    /// The deadline counts from this call, not from the first poll.
    ///
    /// A plain function, not an `async fn`: an `async fn` keeps its argument and the future it
    /// pins in two slots of its state, which doubled every request future above this one (16 KB
    /// for one batched operation, moved at every level and into the box that runs it).
    pub(crate) fn within<F: Future>(
        &self,
        deadline: Instant,
        request: F,
    ) -> impl Future<Output = Option<F::Output>> {
        let (abort, registration) = AbortHandle::new_pair();
        {
            let mut state = self.shared.state.lock();
            let queue = &mut state.queue;
            // Requests mostly finish in the order they started: drop the finished ones in front.
            while queue.front().is_some_and(|(_, abort)| abort.is_aborted()) {
                queue.pop_front();
            }
            queue.push_back((deadline, abort.clone()));
            // A shorter bound than those before it: moved forward to its place, to fire on time.
            let mut i = queue.len() - 1;
            while i > 0 && queue[i - 1].0 > deadline {
                queue.swap(i - 1, i);
                i -= 1;
            }
            if state.alarm.is_none_or(|alarm| deadline < alarm) {
                state.alarm = Some(deadline);
                self.shared.wake.notify_one();
            }
        }
        // The request's end, or its drop, aborts the handle: that marks the queue's entry as done.
        let done = Done(abort);
        Abortable::new(request, registration).map(move |outcome| {
            drop(done);
            outcome.ok()
        })
    }
}

/// Aborts a request's handle when dropped: with the request's output, or with the request.
struct Done(AbortHandle);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.shared.wake.notify_one();
    }
}

/// The task: fires what is due, then sleeps until the earliest deadline left or a wake-up. It
/// holds the shared state only while awake, so it ends once the `Deadlines` is dropped.
async fn run(shared: Weak<Shared>) {
    loop {
        let Some(strong) = shared.upgrade() else { return };
        let now = Instant::now();
        let alarm = {
            let mut state = strong.state.lock();
            while let Some((at, abort)) = state.queue.front() {
                if *at > now && !abort.is_aborted() {
                    break;
                }
                abort.abort();
                state.queue.pop_front();
            }
            state.alarm = state.queue.front().map(|(at, _)| *at);
            state.alarm
        };
        let woken = async { strong.wake.notified().await };
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep_until(alarm.unwrap_or(now + IDLE)) => {}
        }
        drop(strong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_past_their_deadline_are_dropped_in_deadline_order() {
        let deadlines = Deadlines::start();
        let start = Instant::now();
        let forever = std::future::pending::<()>;
        let long = deadlines.within(start + Duration::from_secs(2), forever());
        let short = deadlines.within(start + Duration::from_millis(500), forever());
        let done = deadlines.within(start + Duration::from_millis(100), async { 7 });
        assert_eq!(done.await, Some(7));
        // The shorter bound, registered after the longer one, still fires on time.
        let (long, short) = tokio::join!(
            async {
                long.await;
                start.elapsed()
            },
            async {
                short.await;
                start.elapsed()
            }
        );
        assert_eq!(short, Duration::from_millis(500));
        assert_eq!(long, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_finishes_in_time_is_not_cut() {
        let deadlines = Deadlines::start();
        let deadline = Instant::now() + Duration::from_secs(1);
        let slow = tokio::time::sleep(Duration::from_millis(999));
        assert_eq!(deadlines.within(deadline, slow).await, Some(()));
        let late = tokio::time::sleep(Duration::from_millis(1001));
        assert_eq!(deadlines.within(deadline, late).await, None);
    }
}
