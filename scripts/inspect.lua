-- Read one lock for operators (relock list / show, LockClient::inspect and its kin): changes nothing.
-- KEYS[1] the lock hash (of a read-write lock: its write lock); KEYS[2] its fence counter.
-- ARGV[1] which lock: 'plain' (or absent), 'fair' with KEYS[3] its queue (see fair_acquire.lua),
-- or 'rw' with KEYS[3] its readers' set and KEYS[4] its waiting writers' hash (see rw_read.lua).
-- Returns {type of KEYS[1], fence or false, PTTL of KEYS[1], HGETALL of KEYS[1]}, the last two
-- false when KEYS[1] is not a hash (`none`: nobody holds it), then
--   for 'fair': the queue in order (the first 1,000), {owner id, PTTL of its waiter key} each, or
--               false when the queue is neither a sorted set nor absent;
--   for 'rw':   the readers, {reader key, PTTL, HGETALL or false when not a hash} per member of the
--               readers' set (a reader key that is gone has PTTL -2), or false when that set is of
--               another type; then {PTTL, HKEYS} of the waiting writers' hash ({-2, {}} when absent),
--               or false when it is of another type.
-- A fence of another type reads as false rather than failing the read. One script call, so
-- everything read is of the same moment.
local kind = redis.call('TYPE', KEYS[1])['ok']
local fence = false
if redis.call('TYPE', KEYS[2])['ok'] == 'string' then
  fence = redis.call('GET', KEYS[2])
end
local out = {kind, fence, false, false}
if kind == 'hash' then
  out[3] = redis.call('PTTL', KEYS[1])
  out[4] = redis.call('HGETALL', KEYS[1])
end
if ARGV[1] == 'fair' then
  local queue = false
  local found = redis.call('TYPE', KEYS[3])['ok']
  if found == 'zset' or found == 'none' then
    queue = {}
    for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, 999)) do
      queue[#queue + 1] = {id, redis.call('PTTL', KEYS[3] .. ':' .. id)}
    end
  end
  out[5] = queue
elseif ARGV[1] == 'rw' then
  local readers = false
  local found = redis.call('TYPE', KEYS[3])['ok']
  if found == 'set' or found == 'none' then
    readers = {}
    for _, reader in ipairs(redis.call('SMEMBERS', KEYS[3])) do
      local fields = false
      if redis.call('TYPE', reader)['ok'] == 'hash' then
        fields = redis.call('HGETALL', reader)
      end
      readers[#readers + 1] = {reader, redis.call('PTTL', reader), fields}
    end
  end
  local waiting = false
  found = redis.call('TYPE', KEYS[4])['ok']
  if found == 'hash' or found == 'none' then
    waiting = {redis.call('PTTL', KEYS[4]), redis.call('HKEYS', KEYS[4])}
  end
  out[5] = readers
  out[6] = waiting
end
return out
