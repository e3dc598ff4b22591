-- A guarded write: commands applied only while a hold holds its lock (run alone, without
-- prelude.lua). The lock and the data it guards live in one slot, so one script call checks the
-- hold and writes, and nothing runs in between.
-- KEYS[1] the lock hash; KEYS[2..] the keys of the checks and commands, in their order.
-- ARGV[1] the hold's field (`owner:generation`); ARGV[2] the number of checks; ARGV[3] the number
-- of commands. Then each check as `kind, value` (its key the next of KEYS): kind 'min' (the key's
-- integer value, a missing key 0, is at least value), 'eq' (the key's string value is value) or
-- 'absent' (the key does not exist; value ''). Then each command as `name, nkeys, nargs`, followed
-- by its nargs arguments (its nkeys keys are the next of KEYS, before its arguments).
--
-- Returns {0} when the hold is not there (lost: nothing is applied), {2, i} when check i (from 1)
-- does not hold (nothing is applied), else {1, replies} with each command's reply. The checks run
-- before any command. A command that fails ends the call with its error; commands before it stay
-- applied, as in MULTI/EXEC. A resend is the caller's to avoid: it is not idempotent.
local call = redis.call
if call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {0}
end
local key, arg = 2, 4
for i = 1, tonumber(ARGV[2]) do
  local kind, value, k = ARGV[arg], ARGV[arg + 1], KEYS[key]
  arg, key = arg + 2, key + 1
  local ok
  if kind == 'min' then
    ok = (tonumber(call('GET', k) or '0') or 0) >= tonumber(value)
  elseif kind == 'eq' then
    ok = call('GET', k) == value
  else
    ok = call('EXISTS', k) == 0
  end
  if not ok then
    return {2, i}
  end
end
local replies = {}
for i = 1, tonumber(ARGV[3]) do
  local name, nkeys, nargs = ARGV[arg], tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
  arg = arg + 3
  local argv = {}
  for j = 1, nkeys do
    argv[j] = KEYS[key]
    key = key + 1
  end
  for j = 1, nargs do
    argv[nkeys + j] = ARGV[arg]
    arg = arg + 1
  end
  local reply = call(name, unpack(argv))
  if reply == false then
    reply = {}
  end
  replies[i] = reply
end
return {1, replies}
