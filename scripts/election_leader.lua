-- The leader of an election, as everyone may read it (run alone, without prelude.lua).
-- KEYS[1] the election's lock hash, KEYS[2] the leader's record (`term field value`, written by
-- the leader's guarded write when it took office).
--
-- Returns {} when nobody leads: the lock is free, or its holder has not written its record yet
-- (the record names another hold, an ended term's). Else {term, value, ms}: the leader's term
-- (its fencing token), its value and the lease it has left.
local record = redis.call('GET', KEYS[2])
if not record then
  return {}
end
local first = string.find(record, ' ', 1, true)
local second = first and string.find(record, ' ', first + 1, true)
if not second then
  return {}
end
local field = string.sub(record, first + 1, second - 1)
if redis.call('HEXISTS', KEYS[1], field) == 0 then
  return {}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return {}
end
return {string.sub(record, 1, first - 1), string.sub(record, second + 1), ttl}
