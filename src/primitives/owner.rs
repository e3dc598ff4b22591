//! Who holds a lock: the unit of reentrancy.

use fred::bytes_utils::Str;
use std::future::Future;

use uuid::Uuid;

tokio::task_local! {
    static SCOPED: Owner;
}

/// The owner of an acquisition: acquisitions by the same owner re-enter each other's hold, those of
/// different owners exclude each other.
///
/// By default the owner is the current tokio task (or, outside a task, the current thread), combined
/// with the client's random id: Redisson's "client id : thread id", with the task as the unit of
/// execution. An explicit `Owner` overrides that:
///
/// - [`Lock::owner`](crate::Lock::owner) acquires on behalf of an owner, so several tasks can share
///   one hold (the guard remembers its owner, so any task can release it);
/// - [`Owner::scope`] runs a future as that owner, so every acquisition inside it uses it.
///
/// **Futures composed inside one task** (`join!`, `select!`, `join_all`) share that task's identity,
/// so by default they would re-enter each other's hold instead of excluding each other. Give each its
/// own owner with `scope`:
///
/// ```no_run
/// # async fn demo(lock: relock::Lock) -> Result<(), relock::Error> {
/// use relock::Owner;
///
/// let a = Owner::new().scope(async {
///     let _guard = lock.acquire().await?;
///     // critical section of `a`
///     Ok::<_, relock::Error>(())
/// });
/// let b = Owner::new().scope(async {
///     let _guard = lock.acquire().await?;
///     // critical section of `b`, never at the same time as `a`'s
///     Ok::<_, relock::Error>(())
/// });
/// let (ra, rb) = tokio::join!(a, b);
/// ra?;
/// rb?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(Str);

impl Owner {
    /// A fresh owner, distinct from every task, thread and other owner.
    ///
    /// ```
    /// use relock::Owner;
    /// assert_ne!(Owner::new(), Owner::new());
    /// ```
    #[allow(clippy::new_without_default)]
    pub fn new() -> Owner {
        Owner(format!("o{}", Uuid::new_v4().simple()).into())
    }

    /// Runs `future` with this owner as the default owner of every acquisition inside it.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        SCOPED.scope(self, future)
    }

    /// The owner in force here: the scoped one, else the current task, else the current thread.
    pub(crate) fn current() -> Owner {
        if let Ok(owner) = SCOPED.try_with(Owner::clone) {
            return owner;
        }
        match tokio::task::try_id() {
            Some(id) => Owner(format!("t{id}").into()),
            None => {
                let thread = format!("{:?}", std::thread::current().id());
                let digits: String = thread.chars().filter(char::is_ascii_digit).collect();
                Owner(format!("th{digits}").into())
            }
        }
    }

    /// The id stored in Redis: unique to the client, so the same `Owner` used through two clients
    /// gives two distinct holders.
    pub(crate) fn id_for(&self, client: &Uuid) -> Str {
        client_id(client, &self.0)
    }

    /// [`current`](Owner::current)`().id_for(client)` (every acquisition asks). A task's id is
    /// formatted once while the same task asks again on the same thread (a loop of acquisitions):
    /// the last one is kept per thread, which saves about a thousand instructions an acquisition.
    pub(crate) fn current_id_for(client: &Uuid) -> Str {
        if let Ok(id) = SCOPED.try_with(|owner| owner.id_for(client)) {
            return id;
        }
        match tokio::task::try_id() {
            // The memo is gone only while the thread ends (a guard dropped by a thread-local's
            // destructor, say): the id is made anew then.
            Some(task) => LAST_TASK_ID
                .try_with(|last| {
                    let mut last = last.borrow_mut();
                    match &*last {
                        Some((seen, of, id)) if *seen == task && of == client => id.clone(),
                        _ => {
                            let id = task_owner_id(client, task);
                            *last = Some((task, *client, id.clone()));
                            id
                        }
                    }
                })
                .unwrap_or_else(|_| task_owner_id(client, task)),
            None => Owner::current().id_for(client),
        }
    }
}

/// The owner id of `task` through `client`: the client, `:t` and the task's id.
fn task_owner_id(client: &Uuid, task: tokio::task::Id) -> Str {
    use std::io::Write;
    // A task id is a number: `t` and its digits fit.
    let mut buf = [0u8; 24];
    let mut free = &mut buf[..];
    let _ = write!(free, "t{task}");
    let len = 24 - free.len();
    client_id(client, std::str::from_utf8(&buf[..len]).unwrap_or("t"))
}

std::thread_local! {
    /// The last owner id [`Owner::current_id_for`] made for a task on this thread: the task, the
    /// client, the id. A memo: the id is made of the task's id and the client's alone.
    static LAST_TASK_ID: std::cell::RefCell<Option<(tokio::task::Id, Uuid, Str)>> =
        const { std::cell::RefCell::new(None) };
}

/// `client` (its simple form), `:` and `rest`.
fn client_id(client: &Uuid, rest: &str) -> Str {
    let mut simple = [0u8; uuid::fmt::Simple::LENGTH];
    crate::redis::keys::joined(&[client.simple().encode_lower(&mut simple), ":", rest])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_id_is_the_client_a_colon_and_the_owner_whatever_its_length() {
        let client = Uuid::new_v4();
        let owner = Owner::new();
        let long = "x".repeat(200);
        for rest in ["t42", &owner.0, &long] {
            let id = client_id(&client, rest);
            assert_eq!(&*id, format!("{}:{rest}", client.simple()));
        }
        assert_eq!(
            &*owner.id_for(&client),
            format!("{}:{}", client.simple(), owner.0)
        );
    }

    /// The per-thread memo of the last task's id gives each task and client its own id, as
    /// formatting it each time does: tasks one after another on one thread, two clients.
    #[test]
    fn a_tasks_owner_id_is_its_own_on_a_shared_thread() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let ids = |client: Uuid| {
            runtime.block_on(runtime.spawn(async move {
                let task = tokio::task::id();
                let first = Owner::current_id_for(&client);
                let other = Owner::current_id_for(&Uuid::new_v4());
                assert_eq!(Owner::current_id_for(&client), first, "the same task asks again");
                assert_ne!(other, first, "another client");
                assert_eq!(&*first, format!("{}:t{task}", client.simple()));
                first
            }))
        };
        let (one, two, three) = (ids(a), ids(a), ids(b));
        let one = one.expect("task");
        assert_ne!(one, two.expect("task"), "another task on the same thread");
        assert_ne!(one, three.expect("task"));
    }
}
