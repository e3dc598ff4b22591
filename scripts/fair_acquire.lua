-- Take a fair lock, or wait for it in the queue (a function of the batch script, see batch.lua):
-- waiters are granted in arrival order. fair_release.lua releases it, fair_leave.lua gives up a
-- waiter's place; both use fair_head and are prepended after this file (and prelude.lua before it).
-- The keys of one fair lock share its `{name}` hash tag:
--   lock:   the lock hash, as in acquire.lua (field `owner:generation`, value: count);
--   fence:  its fence counter;
--   queue:  a sorted set of the waiting owner ids, scored by arrival (the server's clock in µs;
--           ZADD NX keeps a waiter's first place when its attempt is resent or repeated);
--   waiter: one per waiting owner, queue .. ':' .. owner id: a hash whose one field is the owner id,
--           with the waiter's lease as its TTL. The watchdog renews it while the owner waits (a
--           heartbeat, as for a lock's hold); the waiter removes it when it stops waiting. A waiter
--           whose key is gone (crashed, or cut off for a lease) is dropped from the queue by the next
--           call that meets it at the head, so the queue never sticks behind it.
-- Releases announce the next live waiter by name (its owner id is the message), so that only the
-- waiter whose turn it is wakes up.

-- The first live waiter of the queue and its key's TTL (dead ones are removed); false if none.
local function fair_head(queue)
  while true do
    local first = call('ZRANGE', queue, 0, 0)
    if #first == 0 then
      return false, -2
    end
    local ttl = call('PTTL', queue .. ':' .. first[1])
    if ttl ~= -2 then
      return first[1], ttl
    end
    call('ZREM', queue, first[1])
  end
end

-- Puts the owner `id` in the queue (at the back, or where it already was) with a waiter key of
-- `lease` ms.
local function fair_join(queue, id, lease)
  local t = call('TIME')
  call('ZADD', queue, 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), id)
  local waiter = queue .. ':' .. id
  call('HSET', waiter, id, 1)
  call('PEXPIRE', waiter, lease)
end

-- A fair lock for `owner` (field): granted as acquire.lua grants, but only to the owner at the head
-- of the queue when anyone waits (a reentrant acquisition of a live hold goes ahead). `enqueue`
-- (false, or ms): a refusal puts the owner in the queue, its waiter key living that long. Replies
-- as acquire.lua's. A refusal because others are ahead gives as ttl the sooner of the holder's
-- lease and the key of the waiter just ahead of this owner: a release wakes only the waiter it
-- names, and should the one ahead be gone (crashed, cut off: nobody announces its key running
-- out), this owner tries again as soon as its place is free.
--
-- A grant to the head of the queue may leave the next waiter asleep past the new lease: that
-- waiter sleeps at most until the head's key would have run out (the sooner of the two ttls
-- above), and nobody announces a lease that runs out. So when the new lease is the shorter (a
-- fixed lease under the heartbeat's), the grant names the next waiter on `publish`, and it
-- learns the new holder's lease at once. Under the watchdog the lease is the longer, and no
-- message goes.
local function acquire_fair(lock, fence, queue, owner, lease, target, in_step, enqueue, publish)
  if not absent_or(queue, 'zset') then
    return wrong_type()
  end
  local id = owner_of(owner)
  local fresh = target == 1 or call('HEXISTS', lock, owner) == 0
  local head = false
  if fresh then
    head = fair_head(queue)
    if head and head ~= id then
      if enqueue and id then
        fair_join(queue, id, enqueue)
      end
      -- The waiter just ahead: of this owner's place, or of the back of the queue for a try.
      local rank = id and call('ZRANK', queue, id)
      local ahead = rank and call('ZRANGE', queue, rank - 1, rank - 1)
        or call('ZRANGE', queue, -1, -1)
      local ttl = call('PTTL', lock)
      local ahead_ttl = #ahead == 1 and call('PTTL', queue .. ':' .. ahead[1]) or -2
      if ttl < 0 or (ahead_ttl >= 0 and ahead_ttl < ttl) then
        ttl = ahead_ttl
      end
      return {0, ttl}
    end
  end
  local reply = {acquire(lock, fence, owner, lease, target, in_step)}
  if reply[1] == 1 then
    if head then
      local waiter = queue .. ':' .. head
      local slept = call('PTTL', waiter)
      call('ZREM', queue, head)
      call('DEL', waiter)
      if publish and tonumber(lease) < slept then
        local next = fair_head(queue)
        if next then
          call(publish, lock .. ':released', next)
        end
      end
    end
  elseif enqueue and id then
    fair_join(queue, id, enqueue)
  end
  return reply
end
