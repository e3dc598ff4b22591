-- Release a fair lock (a function of the batch script, see batch.lua; keys in fair_acquire.lua's
-- header): release.lua's release, announcing the next live waiter by name when the lock is freed.

-- release.lua's release for a fair lock: a release that frees it announces the next live waiter.
local function release_fair(lock, queue, owner, target, channel, publish)
  if target > 0 then
    return release(lock, owner, target, channel, publish, '1', false)
  end
  local head = fair_head(queue)
  return release(lock, owner, target, channel, publish, head or '1', false)
end
