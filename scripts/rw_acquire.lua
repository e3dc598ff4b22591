-- Take or re-enter one side of a read-write lock (functions of the batch script, see batch.lua).
-- The keys of one read-write lock share its `{name}` hash tag:
--   write:   the write lock, a lock hash as in acquire.lua (field `owner:generation`, value: count);
--   fence:   its fence counter (only writers draw tokens);
--   readers: a set of the reader keys that may be live;
--   reader:  one owner's reader key, `readers` .. ':' .. owner id: a hash whose one field is that
--            owner's read hold (`owner:generation`, value: count) and whose TTL is that reader's
--            lease, so every reader's lease is its own (one reader's crash cuts no other's);
--   waiting: the waiting writers' hash (field: owner id), which holds back new readers so that
--            writers do not starve. A waiting writer keeps its field with a heartbeat (the watchdog
--            renews it like a hold, see `Kind::Mark`), and removes it when it stops waiting; a
--            crashed waiter's field goes with the key's TTL.
-- Counts are set to a target, never incremented (a resend leaves the same state), as in acquire.lua.
-- Replies as acquire.lua's: {1, previous count, token} or {0, ttl in ms}; besides, {-2} when the
-- owner asks for the write lock while it holds the read lock (an upgrade, which would deadlock as
-- soon as two readers tried it). A key of another type fails before anything is written.

-- The owner id of a field `owner:generation`.
local function owner_of(field)
  return string.match(field, '^(.*):%d+$')
end

-- Whether `key` is absent or of type `kind`.
local function absent_or(key, kind)
  local found = redis.call('TYPE', key)['ok']
  return found == 'none' or found == kind
end

local function wrong_type()
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- Whether the write lock has a field of another owner than `id` (a writer other than this owner).
local function other_writer(write, id)
  if redis.call('EXISTS', write) == 0 then
    return false
  end
  local mine = id and (id .. ':')
  for _, field in ipairs(redis.call('HKEYS', write)) do
    if not mine or string.sub(field, 1, #mine) ~= mine then
      return true
    end
  end
  return false
end

-- A read hold for `owner` (field) in `reader`, this owner's reader key.
local function acquire_read(reader, write, readers, waiting, owner, lease, target)
  if not absent_or(reader, 'hash') or not absent_or(readers, 'set') or not absent_or(write, 'hash')
      or not absent_or(waiting, 'hash') then
    return wrong_type()
  end
  local id = owner_of(owner)
  local prev = redis.call('HGET', reader, owner)
  if not prev then
    -- A fresh read hold. A writer of another owner refuses it; so does a waiting writer, unless this
    -- owner holds the write lock (a downgrade: it goes before the writers waiting behind it).
    -- A reentrant one is granted whatever waits: refusing it would deadlock its own holder.
    local writes = redis.call('EXISTS', write) == 1
    if other_writer(write, id) then
      return {0, redis.call('PTTL', write)}
    end
    if not writes and redis.call('EXISTS', waiting) == 1 then
      return {0, redis.call('PTTL', waiting)}
    end
    -- Any other field of this owner's key is an ended generation of its own (a hold lost, or a
    -- release still on its way): replaced.
    redis.call('DEL', reader)
    -- One reader key that may have outlived its lease (a crashed reader, which never removed itself)
    -- is looked at per fresh read: the set stays near the live readers at O(1) per call.
    local old = redis.call('SRANDMEMBER', readers)
    if old and redis.call('EXISTS', old) == 0 then
      redis.call('SREM', readers, old)
    end
  end
  redis.call('HSET', reader, owner, target)
  redis.call('PEXPIRE', reader, lease)
  redis.call('SADD', readers, reader)
  return {1, tonumber(prev or '0'), 0}
end

-- Records the owner `id` as a waiting writer; the hash lives at least `lease` more.
local function wait_mark(waiting, id, lease)
  redis.call('HSET', waiting, id, 1)
  if redis.call('PTTL', waiting) < lease then
    redis.call('PEXPIRE', waiting, lease)
  end
end

-- A write hold for `owner` (field) on `write`; `mark`: a refusal records this owner as a waiting
-- writer (with the lease as the waiting hash's TTL), a grant removes it.
local function acquire_write(write, fence, readers, waiting, owner, lease, target, in_step, mark)
  if not absent_or(readers, 'set') or not absent_or(waiting, 'hash') then
    return wrong_type()
  end
  local id = owner_of(owner)
  -- Readers refuse a fresh write hold (and a reentrant one whose hold is gone). A reentrant one
  -- holds them off already.
  if target == 1 or redis.call('HEXISTS', write, owner) == 0 then
    local me = id and (readers .. ':' .. id)
    local ttl = false
    for _, reader in ipairs(redis.call('SMEMBERS', readers)) do
      local left = redis.call('PTTL', reader)
      if left == -2 then
        redis.call('SREM', readers, reader)
      elseif reader == me then
        return {-2}
      elseif not ttl or left < ttl then
        ttl = left
      end
    end
    if ttl then
      if mark and id then
        wait_mark(waiting, id, lease)
      end
      return {0, ttl}
    end
  end
  local reply = acquire(write, fence, owner, lease, target, in_step)
  if reply[1] == 1 then
    if id then
      redis.call('HDEL', waiting, id)
    end
  elseif mark and id then
    wait_mark(waiting, id, lease)
  end
  return reply
end
