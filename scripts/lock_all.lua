-- Take several locks at once, all or none, on one server (LockSet on a single Redis): prelude.lua
-- and acquire.lua are prepended to this file.
-- KEYS: per lock, its hash and its fence counter (KEYS[2i - 1], KEYS[2i]).
-- ARGV: per lock, its hold's field (`owner:generation`), the count after this acquisition and the
-- lease in ms (ARGV[3i - 2], ARGV[3i - 1], ARGV[3i]).
--
-- Every lock is checked before anything is written: one held by another owner refuses the whole
-- set (only that holder is marked, see acquire.lua), and a reentrant acquisition (count > 1) whose
-- hold is gone refuses it too, naming that lock (its holder must learn it lost the lock). Counts
-- are set, not incremented, as in acquire.lua: a resend leaves the same state.
-- Returns {1, then per lock: previous count, token} when every lock is granted,
--         {0, remaining ttl in ms, i} when lock i is held by another owner (the first such),
--         {-3, i} when lock i was to be re-entered but its hold is gone.
-- A key of another type fails the call before anything is written.
-- acquire.lua calls commands through prelude.lua's `call`.
call = redis.call
local n = #KEYS / 2
for i = 1, n do
  local lock, owner, target = KEYS[2 * i - 1], ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  if not absent_or(lock, 'hash') or not absent_or(KEYS[2 * i], 'string') then
    return wrong_type()
  end
  local held = redis.call('EXISTS', lock) == 1
  if held and not redis.call('HGET', lock, owner) then
    -- Another owner's field refuses; an ended generation of this owner does not (acquire replaces
    -- it). The set then waits for that lock's release (see lock_set.rs): its holder is marked, as a
    -- refusal in acquire.lua marks it.
    if other_fields(lock, owner, true) then
      return {0, redis.call('PTTL', lock), i}
    end
  end
  if target > 1 and not (held and redis.call('HGET', lock, owner)) then
    return {-3, i}
  end
end
local out = {1}
for i = 1, n do
  local _, prev, token = acquire(KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 2], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i - 1]), false)
  out[#out + 1] = prev
  out[#out + 1] = token
end
return out
