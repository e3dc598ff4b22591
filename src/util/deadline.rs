//! Bounds for requests without a timer per request.
//!
//! A tokio timer that becomes the runtime's earliest makes tokio wake a parked worker to re-arm
//! its sleep. One timer per lock operation (fred's per-command timeout, relock's own bounds) did
//! that on nearly every operation after the runtime had gone idle for a moment: on a 2-vCPU machine
//! the hot-lock bench's handoff gap doubled (see the README's performance section).
//!
//! [`Deadlines`] keeps the bounds of requests in one heap and one task sleeps until the earliest;
//! a request that runs past its deadline is dropped there. Registering is a heap push; entries of
//! requests that finished are popped from the top as new ones come, and the rest of them swept out
//! whenever the heap has doubled since the last sweep (a finished request with a late deadline
//! stays below the earlier ones in flight: bounds of different lengths share one heap, such as an
//! operation's and its batch round's, 20 ms longer). The task wakes only when the earliest
//! deadline comes, or when a new one is earlier than its alarm.
//!
//! (A queue kept sorted by moving each new entry forward to its place cost 9 % of the client's CPU
//! in a 16-task acquire/release loop: every operation's bound moved past the last 20 ms of rounds.)
//!
//! A request marks its entry done when it ends, by dropping the only strong handle to it; its end
//! wakes nothing. (Its end used to abort the handle as well while fewer than 128 requests were in
//! flight: a wasted wake of its own task, which made tokio wake the runtime's second worker. On an
//! earlier 2-vCPU VM that kept the worker up for the next reply and a single task's cycle took
//! 18 % less. On the current one, 2 vCPUs of an AMD EPYC, it cost: without it 1 task ran 13-18 %
//! more cycles per second, 2 tasks 65 % more, with a quarter less CPU per cycle; 3 to 256 tasks
//! the same or better. It went; it had also hidden a waiter that slept through a release, see
//! `waiters::subscriber::sync`.)
//!
//! The task stops once its `Deadlines` is dropped and the requests it bounds have ended (each
//! holds the shared state until it ends, so its bound holds to the last).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, FutureExt};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long the task sleeps with nothing to watch (it is woken for anything new).
const IDLE: Duration = Duration::from_secs(3600);

/// The heap's size below which it is never swept.
const SWEEP_MIN: usize = 64;

/// A heap of deadlines, and the task that enforces them (see the module doc).
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// A deadline earlier than the task's alarm was added, or the `Deadlines` is gone.
    wake: Notify,
}

/// Something due at an instant, ordered earliest first for a max-heap (`BinaryHeap` pops its
/// greatest). Also the releaser's records due later.
pub(crate) struct Due<T>(pub(crate) Instant, pub(crate) T);

impl<T> PartialEq for Due<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T> Eq for Due<T> {}

impl<T> PartialOrd for Due<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Due<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.cmp(&self.0)
    }
}

/// A deadline and the abort handle of its request, whose only strong reference the request holds:
/// gone once the request finished or was dropped.
type Entry = Due<Weak<AbortHandle>>;

impl Entry {
    fn done(&self) -> bool {
        self.1.strong_count() == 0
    }
}

struct State {
    /// The deadlines, earliest on top.
    heap: BinaryHeap<Entry>,
    /// The heap's size at which finished entries are swept out next.
    sweep_at: usize,
    /// When the task wakes next (`None`: it sleeps until woken). A later deadline needs no wake-up:
    /// the task looks at the heap again then. So a steady stream of requests costs the task about
    /// one wake-up per bound's length, and no timer of its own.
    alarm: Option<Instant>,
}

impl Deadlines {
    /// Starts the task; inside a tokio runtime.
    pub(crate) fn start() -> Deadlines {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                heap: BinaryHeap::new(),
                sweep_at: SWEEP_MIN,
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
        let abort = Arc::new(abort);
        {
            let mut guard = self.shared.state.lock();
            let state = &mut *guard;
            let heap = &mut state.heap;
            // Requests mostly finish in the order they started: drop the finished ones on top.
            while heap.peek().is_some_and(Entry::done) {
                heap.pop();
            }
            if heap.len() >= state.sweep_at {
                heap.retain(|entry| !entry.done());
                // Doubled before the next sweep: each sweep's cost is paid by as many pushes.
                state.sweep_at = SWEEP_MIN.max(2 * heap.len());
            }
            heap.push(Due(deadline, Arc::downgrade(&abort)));
            if state.alarm.is_none_or(|alarm| deadline < alarm) {
                state.alarm = Some(deadline);
                self.shared.wake.notify_one();
            }
        }
        // The request's end, or its drop, drops the handle: that marks the heap's entry as done.
        Abortable::new(request, registration).map(move |outcome| {
            drop(abort);
            outcome.ok()
        })
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.shared.wake.notify_one();
    }
}

/// The task: fires what is due, then sleeps until the earliest deadline left or a wake-up. It
/// holds the shared state only while awake, so it ends once the `Deadlines` and every request it
/// bounds are gone.
async fn run(shared: Weak<Shared>) {
    loop {
        let Some(strong) = shared.upgrade() else { return };
        let now = Instant::now();
        let alarm = {
            let mut state = strong.state.lock();
            while let Some(entry) = state.heap.peek() {
                if entry.0 > now && !entry.done() {
                    break;
                }
                if let Some(abort) = entry.1.upgrade() {
                    abort.abort();
                }
                state.heap.pop();
            }
            state.alarm = state.heap.peek().map(|entry| entry.0);
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
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

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
    async fn finished_requests_behind_one_in_flight_are_swept() {
        let deadlines = Deadlines::start();
        let start = Instant::now();
        // In flight with the earliest deadline: finished entries cannot be popped from the top.
        let pending = deadlines.within(start + Duration::from_secs(1), std::future::pending::<()>());
        for _ in 0..10_000 {
            assert_eq!(
                deadlines
                    .within(start + Duration::from_secs(2), async { 1 })
                    .await,
                Some(1)
            );
        }
        let len = deadlines.shared.state.lock().heap.len();
        assert!(len <= 2 * SWEEP_MIN, "{len} entries kept");
        assert_eq!(pending.await, None);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    /// Counts the wake-ups of the task that polls a request.
    struct CountingWaker(AtomicUsize);

    impl futures::task::ArcWake for CountingWaker {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, AtomicOrdering::SeqCst);
        }
    }

    /// How many times a request's task is woken, from its first poll to its end.
    fn wakes_of_one_request(deadlines: &Deadlines) -> usize {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = futures::task::waker(counter.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut bounded = std::pin::pin!(deadlines.within(Instant::now() + Duration::from_secs(1), rx));
        assert!(bounded.as_mut().poll(&mut cx).is_pending());
        tx.send(7).unwrap();
        assert_eq!(
            bounded.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Some(Ok(7)))
        );
        counter.0.load(AtomicOrdering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_request_wakes_its_task_only_for_the_reply() {
        let deadlines = Deadlines::start();
        assert_eq!(wakes_of_one_request(&deadlines), 1, "alone");
        let others: Vec<_> = (0..200)
            .map(|_| {
                deadlines.within(
                    Instant::now() + Duration::from_secs(1),
                    std::future::pending::<()>(),
                )
            })
            .collect();
        assert_eq!(wakes_of_one_request(&deadlines), 1, "among others");
        drop(others);
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
