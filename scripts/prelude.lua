-- Helpers shared by the scripts of the batch (see batch.lua) and others that prepend this file.

-- The owner id of a field `owner:generation`.
local function owner_of(field)
  return string.match(field, '^(.*):%d+$')
end

-- The fields of the lock hash `lock` besides `owner`'s own (see acquire.lua): another owner's
-- hold (its field, or false), and this owner's ended generations (a list, or false: made only when
-- there is one) with whether one of them was marked. With `mark`, another owner's hold is marked
-- for the refused caller, unless its mark stands already. A mark is a field ending in `~` (byte
-- 126). acquire.lua and lock_all.lua refuse on another owner's hold.
local function other_fields(lock, owner, mark)
  local id = owner_of(owner)
  local mine = id and (id .. ':')
  local holder = false
  local marked = false
  local ended = false
  local ended_marked = false
  for _, field in ipairs(redis.call('HKEYS', lock)) do
    if mine and string.sub(field, 1, #mine) == mine then
      ended = ended or {}
      ended[#ended + 1] = field
      ended_marked = ended_marked or string.byte(field, -1) == 126
    elseif string.byte(field, -1) == 126 then
      marked = true
    else
      holder = field
    end
  end
  if holder and mark and not marked then
    redis.call('HSET', lock, holder .. '~', '1')
  end
  return holder, ended, ended_marked
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

-- The count left of the countdown latch `key`, a hash (fields `count` and `round`, and one field
-- per arrival: see latch_set.lua), or false when that hash is no latch.
local function latch_left(key)
  local n = tonumber(redis.call('HGET', key, 'count'))
  return n and n - (redis.call('HLEN', key) - 1 - redis.call('HEXISTS', key, 'round'))
end

-- redis.call as a local, for the batch functions (acquire.lua, release.lua and the others the batch
-- runs): a global's lookup goes through the globals' metatable (the server's global protection),
-- which cost about 30 of the 400 ns of a command called from a function (100,000
-- `PTTL`s in one `FCALL`). Set where a call starts (batch.lua, lock_all.lua), not here: a library's
-- code runs at `FUNCTION LOAD`, where `redis` has no `call`. The helpers here keep `redis.call`, as
-- the scripts that include only this file do.
local call = false

-- The server's clock, read once per script call: TIME's reply ({seconds, microseconds}) and the
-- same instant in microseconds as digits (seconds, then the microseconds padded to six), a string:
-- the fence compares and writes it as one (see acquire.lua). Every call of TIME costs about as much
-- as a small command, and the acquisitions of one batch can share a reading (each lock has its own
-- fence counter; a counter already at the reading draws the next number above it). Built by one
-- concatenation, once: `string.format('%.0f')` costs the server about as much as a command does,
-- and padding with `string.sub` makes two strings more.
local clock_reading = false
local clock_digits = false
local clock_pad = {'00000', '0000', '000', '00', '0', ''}
local function clock()
  if not clock_reading then
    clock_reading = redis.call('TIME')
    local micros = clock_reading[2]
    clock_digits = clock_reading[1] .. clock_pad[#micros] .. micros
  end
  return clock_reading, clock_digits
end

-- Draws the next fencing token from the counter `fence`; `in_step`: the server is one master of a
-- quorum. Returns the token, a number or its digits. Uses `call` (set by the caller's script).
--
-- The next token is above the counter and never below the server's clock in microseconds. The
-- clock floor keeps tokens rising when the counter lost its latest increments: a Redis restarted
-- without persistence, or a replica promoted before it received them (asynchronous replication).
-- It holds as long as this server's clock is not behind the one that drew the last token (the old
-- primary's, after a failover) by more than the time since. The clock is nearly always ahead of
-- the counter, so the token is written first and the counter read back in the same command; a
-- counter ahead of the clock is then written again above it.
--
-- A master of a quorum (in_step) keeps its counter in step with the others instead: its floor is
-- the start of the current second, not the microsecond, unless its counter is missing (a restart
-- without persistence: that floor would not cover tokens drawn earlier in the same second). Masters
-- in step draw the same token, so the client need not write it back (see quorum.rs); at each new
-- second they all meet at the same floor again. A counter that lost increments while present (a
-- promoted replica) is covered from the next second on; within the same second, the quorum's
-- restart quarantine keeps such a master out.
-- A counter of another type fails the call (SET ... GET and INCR on another type fail without
-- writing).
local function draw_token(fence, in_step)
  -- Read once per script call: a batch's acquisitions share it.
  local t, now = clock()
  if in_step then
    -- The counter plus one, in one command: INCR is the read and the write of the step. Only at
    -- the first draw of a second (or with the counter missing: INCR gives 1) is the floor above
    -- it, and written over it. A resend draws once more, as a GET and SET would: tokens only rise.
    -- The floor as a number from the seconds' ten digits (sixteen cost the server more to
    -- convert), as digits only when written.
    local token = call('INCR', fence)
    if token == 1 then
      call('SET', fence, now)
      return now
    elseif token < tonumber(t[1]) * 1000000 then
      token = t[1] .. '000000'
      call('SET', fence, token)
    end
    return token
  end
  -- Compared as digit strings, not numbers: converting sixteen digits costs the server more than
  -- the comparison (a longer string of digits is the larger number; one of equal length compares
  -- as text). A counter that is no number fails the call below (tonumber gives nil), unless it is
  -- shorter than the clock's digits, when the clock simply replaces it.
  local counter = call('SET', fence, now, 'GET')
  if counter and (#counter > #now or (#counter == #now and counter >= now)) then
    local token = string.format('%.0f', tonumber(counter) + 1)
    call('SET', fence, token)
    return token
  end
  return now
end
