-- Set an owner's hold count to a target; at zero, delete the hold and announce the release where
-- someone may wait (a function of the batch script, see batch.lua).
-- lock: the lock hash (or a reader key, or the waiting writers' hash of a read-write lock); owner:
-- the hold's field; target: the count left after this release; channel: the release channel, or
-- false for a plain lock's, `lock` followed by `:released` (`keys.rs`), made only when published;
-- publish: the command that announces it (PUBLISH or SPUBLISH); message: '1' wakes one waiter per
-- client, '*' every waiter (a read-write lock's waiters differ: a reader woken in a writer's place
-- would leave the writer asleep), either with '~' before it for the undo of a grant that never
-- was a hold (a refused round of a quorum; see batch.lua's 'y'); index: false, or the set that
-- lists `lock` (a read-write lock's readers), from which a released reader key is removed; marks:
-- a plain lock's release, which publishes only when a waiter marked the hold (see acquire.lua: the
-- mark `owner~` goes with the hold), or false: always (the client has waiters of its own on the
-- channel, or the waiters of this kind leave no mark).
--
-- Setting (not decrementing) the count makes a repeated call harmless.
-- Returns 0 when the owner does not hold the lock (nothing changed), 1 when a count is left,
--         2 when the lock was released, and then a second value: how many subscribers heard its
--         release message (0 when none was published: nobody marked the hold; a plain lock's
--         release passes it on, see batch.lua; the local handoff uses it to tell whether other
--         clients wait).
local function release(lock, owner, target, channel, publish, message, index, marks)
  if target > 0 then
    if call('HEXISTS', lock, owner) == 0 then
      return 0
    end
    call('HSET', lock, owner, target)
    return 1
  end
  -- HDEL says whether the field was there: one call fewer on the common path. With marks, it
  -- removes the hold's mark too, and says whether there was one (2 fields): a mark is never there
  -- without its hold.
  local removed = call('HDEL', lock, owner, owner .. '~')
  if removed == 0 then
    return 0
  end
  if index then
    call('SREM', index, lock)
  end
  if marks and removed == 1 then
    return 2, 0
  end
  -- No EXISTS check: a field could outlive this one only as an ended generation of the same owner
  -- (its acquisition removes those), and a release message then is a harmless extra wake-up.
  return 2, call(publish, channel or (lock .. ':released'), message)
end
