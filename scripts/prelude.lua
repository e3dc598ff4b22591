-- Helpers shared by the scripts of the batch (see batch.lua) and others that prepend this file.

-- The owner id of a field `owner:generation`.
local function owner_of(field)
  return string.match(field, '^(.*):%d+$')
end

-- Whether `key` is absent or of type `kind`.
local function absent_or(key, kind)
  local found = redis.call('TYPE', key)['ok']
  return found == 'none' or found == kind
end

-- The WRONGTYPE error reply, as Redis's own commands give it.
local function wrong_type()
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

-- The count left of the countdown latch `key`, a hash (field `count`, and one field per arrival:
-- see latch_set.lua), or false when that hash is no latch.
local function latch_left(key)
  local n = tonumber(redis.call('HGET', key, 'count'))
  return n and n - (redis.call('HLEN', key) - 1)
end

-- The server's clock, read once per script call: TIME's reply ({seconds, microseconds}) and the
-- same instant in microseconds as digits (seconds, then the microseconds padded to six), a string:
-- the fence compares and writes it as one (see acquire.lua). Every call of TIME costs about as much
-- as a small command, and the acquisitions of one batch can share a reading (each lock has its own
-- fence counter; a counter already at the reading draws the next number above it). Built by
-- concatenation, once: `string.format('%.0f')` costs the server about as much as a command does.
local clock_reading = false
local clock_digits = false
local function clock()
  if not clock_reading then
    clock_reading = redis.call('TIME')
    clock_digits = clock_reading[1] .. string.sub('00000' .. clock_reading[2], -6)
  end
  return clock_reading, clock_digits
end
