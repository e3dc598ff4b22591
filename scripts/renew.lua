-- Renew many leases in one call (the watchdog's batch for one node and slot), or check that they are
-- held.
-- KEYS[i] a lock hash; ARGV[1] the lease in ms of every key of the call, or 0 to only check (fixed
-- leases, never extended); ARGV[i + 1] the field of the hold expected in KEYS[i] (owner and
-- generation).
-- Returns the positions (from 1) of the keys whose hold is gone, nothing changed for them: most
-- calls answer an empty list. A flag per key, and a lease per key, cost the server and the client
-- more than the renewals' own commands did (100,000 held locks). A field names one generation of a
-- hold, so a renewal that arrives late never extends a later hold of the same owner. pcall keeps
-- one foreign key (say, of another type) from failing the whole batch: it counts as gone.
local call, pcall = redis.call, redis.pcall
local lease = ARGV[1]
local renew = lease ~= '0'
local gone = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  if pcall('HEXISTS', key, ARGV[i + 1]) == 1 then
    if renew then
      call('PEXPIRE', key, lease)
    end
  else
    gone[#gone + 1] = i
  end
end
return gone
