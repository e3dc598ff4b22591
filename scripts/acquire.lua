-- Take or re-enter a lock (a function of the batch script, see batch.lua).
-- lock: the lock hash (field: the hold's owner and generation, value: hold count); fence: the fence
-- counter; owner: that field; lease: lease in ms; target: the hold count after this acquisition.
--
-- The count is *set* to target, never incremented, so a call that runs twice (a resend after a dropped
-- connection) leaves the same state behind. A target of 1 starts a new hold and draws a new fencing
-- token (see below); a reentrant acquisition returns the current counter.
--
-- Returns {1, previous count of this owner (0 if none), token} when granted,
--         {0, remaining ttl in ms} when another owner holds the lock.
-- A lock or fence of another type fails (WRONGTYPE) before anything is written: both are read first.
local function acquire(lock, fence, owner, lease, target)
  local prev = redis.call('HGET', lock, owner)
  if not prev and redis.call('EXISTS', lock) == 1 then
    return {0, redis.call('PTTL', lock)}
  end
  local counter = tonumber(redis.call('GET', fence) or '0')

  redis.call('HSET', lock, owner, target)
  redis.call('PEXPIRE', lock, lease)

  local token
  if target == 1 then
    -- The next token is above the counter and never below the server's clock in microseconds. The
    -- clock floor keeps tokens rising when the counter lost its latest increments: a Redis restarted
    -- without persistence, or a replica promoted before it received them (asynchronous replication).
    -- It holds as long as this server's clock is not behind the one that drew the last token (the
    -- old primary's, after a failover) by more than the time since.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    token = math.max(counter + 1, now)
    redis.call('SET', fence, string.format('%.0f', token))
  else
    token = counter
  end
  return {1, tonumber(prev or '0'), token}
end
