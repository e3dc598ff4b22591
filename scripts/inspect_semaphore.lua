-- Read one semaphore for operators (relock show, LockClient::inspect_semaphore): changes nothing.
-- KEYS[1] the semaphore's index hash (see semaphore_acquire.lua): field `permits` the number of
-- permits, and one field per holder key with the permits it holds. The holder keys are named by the
-- index and share its `{name}` hash tag, so they live in its slot.
-- Returns {type of KEYS[1]} when the index is not a hash (`none`: no semaphore of that name),
--         {'hash', permits field or false, holders} when it is, where holders is a list of
--         {holder key, its permits in the index, PTTL of the holder key, HGETALL of the holder key
--         or false when it is not a hash}, one per index field but `permits`. A holder key that is
--         gone (released, or its lease ran out) has PTTL -2: its permits count as free, as the
--         acquire script counts them (which removes its field then; this read does not).
-- One script call, so the permits, the holders and their leases are of the same moment.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' then
  return {kind}
end
local holders = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local holder = entries[i]
  if holder ~= 'permits' then
    local fields = false
    if redis.call('TYPE', holder)['ok'] == 'hash' then
      fields = redis.call('HGETALL', holder)
    end
    holders[#holders + 1] = {holder, entries[i + 1], redis.call('PTTL', holder), fields}
  end
end
local permits = redis.call('HGET', KEYS[1], 'permits')
return {kind, permits, holders}
