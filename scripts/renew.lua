-- Renew many leases in one call (the watchdog's batch for one node).
-- KEYS[i] a lock hash; ARGV[1] the lease in ms; ARGV[i + 1] the owner expected to hold KEYS[i].
-- Returns one flag per key: 1 renewed, 0 the owner no longer holds it (nothing changed for that key).
-- pcall keeps one foreign key (say, of another type) from failing the whole batch.
local out = {}
for i, key in ipairs(KEYS) do
  local held = redis.pcall('HEXISTS', key, ARGV[i + 1])
  if held == 1 then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
