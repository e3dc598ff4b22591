-- Take or re-enter the read side of a read-write lock (a function of the batch script, see batch.lua;
-- prelude.lua's helpers). rw_write.lua takes the write side.
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

-- Whether the write lock has a field of another owner than `id` (a writer other than this owner).
local function other_writer(write, id)
  if call('EXISTS', write) == 0 then
    return false
  end
  local mine = id and (id .. ':')
  for _, field in ipairs(call('HKEYS', write)) do
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
  local prev = call('HGET', reader, owner)
  if not prev then
    -- A fresh read hold. A writer of another owner refuses it; so does a waiting writer, unless this
    -- owner holds the write lock (a downgrade: it goes before the writers waiting behind it).
    -- A reentrant one is granted whatever waits: refusing it would deadlock its own holder.
    local writes = call('EXISTS', write) == 1
    if other_writer(write, id) then
      return {0, call('PTTL', write)}
    end
    if not writes and call('EXISTS', waiting) == 1 then
      return {0, call('PTTL', waiting)}
    end
    -- Any other field of this owner's key is an ended generation of its own (a hold lost, or a
    -- release still on its way): replaced.
    call('DEL', reader)
    -- One reader key that may have outlived its lease (a crashed reader, which never removed itself)
    -- is looked at per fresh read: the set stays near the live readers at O(1) per call.
    local old = call('SRANDMEMBER', readers)
    if old and call('EXISTS', old) == 0 then
      call('SREM', readers, old)
    end
  end
  call('HSET', reader, owner, target)
  call('PEXPIRE', reader, lease)
  call('SADD', readers, reader)
  return {1, tonumber(prev or '0'), 0}
end
