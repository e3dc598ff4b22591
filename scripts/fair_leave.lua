-- A fair lock's waiter gives up its place (a function of the batch script, see batch.lua; keys in
-- fair_acquire.lua's header).

-- A waiter (`field`: its owner id) gives up its place: its key and queue entry go, and if the lock
-- is free, the next live waiter is told it is its turn (it may have been waiting behind this one).
-- If the lock is held and this waiter was next in line, the new next waiter is told too when the
-- holder's lease ends before that waiter would wake by itself: it sleeps at most until the key of
-- the waiter ahead would have run out (see fair_acquire.lua), and a lease that runs out (a fixed
-- lease under the heartbeat's) announces nothing. Named, it tries, learns the lease and wakes at
-- its end. Replies as release.lua's.
local function fair_leave(waiter, queue, lock, field, target, channel, publish)
  if target > 0 then
    return release(waiter, field, target, channel, publish, '1', false)
  end
  -- Read before its key goes: fair_head passes over a waiter whose key is gone.
  local held = call('EXISTS', lock) == 1
  local was_next = held and fair_head(queue) == field
  if call('HDEL', waiter, field) == 0 then
    return 0
  end
  call('ZREM', queue, field)
  if not held then
    local head = fair_head(queue)
    if head then
      call(publish, channel, head)
    end
  elseif was_next then
    local head, ttl = fair_head(queue)
    if head and call('PTTL', lock) < ttl then
      call(publish, channel, head)
    end
  end
  return 2
end
