-- Take n permits of a semaphore for one holder, with a lease of its own (prelude.lua is prepended).
-- KEYS[1] the semaphore's index hash: field `permits` the number of permits, and one field per
--         holder key with the permits it holds; KEYS[2] this holder's key, a hash with one field
--         (the hold's owner and generation) whose value is its permits, and the holder's lease as
--         its TTL (renewed by the watchdog and released like a lock's hold; see renew.lua).
-- ARGV[1] the permits of the semaphore (N), ARGV[2] the permits asked (n, 1..N), ARGV[3] the field,
-- ARGV[4] the lease in ms.
--
-- A holder key that no longer exists (released, or its lease ran out: a crashed holder) gives its
-- permits back here: its index field is removed. The holder keys are named by the index; they share
-- its `{name}` hash tag, so they live in its slot.
-- Returns {1, permits left} when granted (a resend of a granted call finds its field and grants
--         again without taking more), {0, permits left, ms until the soonest holder's lease ends
--         or -1} when refused, {-1, N stored} when the semaphore holds permits under another N
--         (nothing changed; with nothing held, the new N replaces the old).
-- A key of another type is an error, untouched.
if not absent_or(KEYS[1], 'hash') or not absent_or(KEYS[2], 'hash') then
  return wrong_type()
end
local permits, n, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local used, soonest = 0, -1
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local holder, held = entries[i], entries[i + 1]
  if holder ~= 'permits' then
    local ttl = redis.call('PTTL', holder)
    if ttl == -2 then
      redis.call('HDEL', KEYS[1], holder)
    else
      used = used + (tonumber(held) or 0)
      if ttl >= 0 and (soonest < 0 or ttl < soonest) then
        soonest = ttl
      end
    end
  end
end
local stored = tonumber(redis.call('HGET', KEYS[1], 'permits'))
if stored ~= permits then
  if stored and used > 0 then
    return {-1, stored}
  end
  redis.call('HSET', KEYS[1], 'permits', permits)
end
if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then
  redis.call('PEXPIRE', KEYS[2], lease)
  return {1, permits - used}
end
if used + n > permits then
  return {0, permits - used, soonest}
end
redis.call('HSET', KEYS[2], ARGV[3], n)
redis.call('PEXPIRE', KEYS[2], lease)
redis.call('HSET', KEYS[1], KEYS[2], n)
return {1, permits - used - n}
