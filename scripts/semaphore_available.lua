-- Read how many permits of a semaphore are free; changes nothing.
-- KEYS[1] the semaphore's index hash (see semaphore_acquire.lua); ARGV[1] the permits the caller
-- gives the semaphore (N), used when none are stored.
-- Returns {permits free, N in force}: holders whose key is gone (released, or lease ran out) count
-- as free. A key of another type is an error.
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {tonumber(ARGV[1]), tonumber(ARGV[1])}
end
local permits = tonumber(redis.call('HGET', KEYS[1], 'permits')) or tonumber(ARGV[1])
local used = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if entries[i] ~= 'permits' and redis.call('EXISTS', entries[i]) == 1 then
    used = used + (tonumber(entries[i + 1]) or 0)
  end
end
return {permits - used, permits}
