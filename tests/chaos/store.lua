-- The chaos harness's fenced inventory: a read-modify-write that a stale lock holder cannot corrupt.
-- KEYS[1] the stock, KEYS[2] the highest token seen, KEYS[3] the operation sequence,
-- KEYS[4] the number of sales accepted.
-- ARGV[1] 'r' (read) or 'w' (write), ARGV[2] the holder's fencing token, ARGV[3] the new stock (w).
--
-- Reads are fenced too: a holder's read raises the fence to its token, so a holder with an older
-- token can no longer write what it read before (that would overwrite a newer holder's sale).
-- Returns {1, seq, stock} when accepted, {0, fence} when the token is below the fence.
local token = tonumber(ARGV[2])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if token < fence then
  return {0, fence}
end
redis.call('SET', KEYS[2], ARGV[2])
local seq = redis.call('INCR', KEYS[3])
if ARGV[1] == 'r' then
  return {1, seq, tonumber(redis.call('GET', KEYS[1]) or '0')}
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('INCR', KEYS[4])
return {1, seq, tonumber(ARGV[3])}
