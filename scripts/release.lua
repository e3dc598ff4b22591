-- Set an owner's hold count to a target; at zero, delete the lock and announce the release
-- (a function of the batch script, see batch.lua).
-- lock: the lock hash; owner: owner id; target: the count left after this release;
-- channel: the release channel; publish: the command that announces it (PUBLISH or SPUBLISH).
--
-- Setting (not decrementing) the count makes a repeated call harmless.
-- Returns 0 when the owner does not hold the lock (nothing changed), 1 when a count is left,
--         2 when the lock was released and the release published.
local function release(lock, owner, target, channel, publish)
  if target > 0 then
    if redis.call('HEXISTS', lock, owner) == 0 then
      return 0
    end
    redis.call('HSET', lock, owner, target)
    return 1
  end
  -- HDEL says whether the field was there: one call fewer on the common path.
  if redis.call('HDEL', lock, owner) == 0 then
    return 0
  end
  -- No EXISTS check: a field could outlive this one only as an ended generation of the same owner
  -- (its acquisition removes those), and a release message then is a harmless extra wake-up.
  redis.call(publish, channel, '1')
  return 2
end
