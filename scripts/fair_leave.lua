-- A fair lock's waiter gives up its place (a function of the batch script, see batch.lua; keys in
-- fair_acquire.lua's header).

-- A waiter (`field`: its owner id) gives up its place: its key and queue entry go, and if the lock
-- is free, the next live waiter is told it is its turn (it may have been waiting behind this one).
-- Replies as release.lua's.
local function fair_leave(waiter, queue, lock, field, target, channel, publish)
  if target > 0 then
    return release(waiter, field, target, channel, publish, '1', false)
  end
  if call('HDEL', waiter, field) == 0 then
    return 0
  end
  call('ZREM', queue, field)
  if call('EXISTS', lock) == 0 then
    local head = fair_head(queue)
    if head then
      call(publish, channel, head)
    end
  end
  return 2
end
