-- Renew many leases in one call (the watchdog's batch for one node), or check that they are held.
-- KEYS[i] a lock hash; ARGV[2i - 1] the field of the hold expected in KEYS[i] (owner and generation);
-- ARGV[2i] the lease in ms, or 0 to only check (a fixed lease, never extended).
-- Returns one flag per key: 1 held (and renewed if asked), 0 that hold is gone (nothing changed for
-- that key). A field names one generation of a hold, so a renewal that arrives late never extends
-- a later hold of the same owner. pcall keeps one foreign key (say, of another type) from failing
-- the whole batch.
local out = {}
for i, key in ipairs(KEYS) do
  local held = redis.pcall('HEXISTS', key, ARGV[2 * i - 1])
  if held == 1 then
    local lease = tonumber(ARGV[2 * i])
    if lease > 0 then
      redis.call('PEXPIRE', key, lease)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
