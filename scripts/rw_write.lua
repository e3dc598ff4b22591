-- Take or re-enter the write side of a read-write lock (a function of the batch script, see
-- batch.lua; prelude.lua's helpers, acquire.lua's acquire). The keys and replies are those of
-- rw_read.lua's header.

-- Records the owner `id` as a waiting writer; the hash lives at least `lease` more.
local function wait_mark(waiting, id, lease)
  call('HSET', waiting, id, 1)
  if call('PTTL', waiting) < lease then
    call('PEXPIRE', waiting, lease)
  end
end

-- A write hold for `owner` (field) on `write`; `mark` (false, or ms): a refusal records this owner
-- as a waiting writer (the waiting hash lives at least that long), a grant removes it.
local function acquire_write(write, fence, readers, waiting, owner, lease, target, in_step, mark)
  if not absent_or(readers, 'set') or not absent_or(waiting, 'hash') then
    return wrong_type()
  end
  local id = owner_of(owner)
  -- Readers refuse a fresh write hold (and a reentrant one whose hold is gone). A reentrant one
  -- holds them off already.
  if target == 1 or call('HEXISTS', write, owner) == 0 then
    local me = id and (readers .. ':' .. id)
    local ttl = false
    for _, reader in ipairs(call('SMEMBERS', readers)) do
      local left = call('PTTL', reader)
      if left == -2 then
        call('SREM', readers, reader)
      elseif reader == me then
        return {-2}
      elseif not ttl or left < ttl then
        ttl = left
      end
    end
    if ttl then
      if mark and id then
        wait_mark(waiting, id, mark)
      end
      return {0, ttl}
    end
  end
  local reply = {acquire(write, fence, owner, lease, target, in_step)}
  if reply[1] == 1 then
    if id then
      call('HDEL', waiting, id)
    end
  elseif mark and id then
    wait_mark(waiting, id, mark)
  end
  return reply
end
