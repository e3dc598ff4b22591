-- Count a countdown latch down by one arrival; at zero, remove it and wake every waiter.
-- KEYS[1] the latch hash (see latch_set.lua); ARGV[1] the arrival's id (unique per count_down call);
-- ARGV[2] the channel of the latch; ARGV[3] the command that announces it (PUBLISH or SPUBLISH);
-- ARGV[4] the id of the round the caller read just before (latch_count.lua), '0' for none.
-- The message is `*`: every waiter of the channel wakes (a lock's release wakes one).
-- Returns the count left (0 when the latch is open: absent, or this call opened it). An arrival is
-- recorded by its id (HSETNX), so a resent call counts once; once the latch opened, the key is gone
-- and a resend changes nothing. An arrival for another round (sent before this one was armed and
-- held up on its way: a resend, a slow network, a caller that gave up) changes nothing and answers
-- 0: its own round opened without it. Without that, a late copy counted in the next round would
-- release that round's waiters one arrival early. A latch with no round (armed by a relock before
-- rounds) counts any arrival. A key of another type is an error, untouched.
if ARGV[3] ~= 'PUBLISH' and ARGV[3] ~= 'SPUBLISH' then
  return redis.error_reply('ERR relock latch_count_down: unknown publish command')
end
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local left = latch_left(KEYS[1])
if not left then
  return redis.error_reply('WRONGTYPE the key is a hash but not a relock latch')
end
local round = redis.call('HGET', KEYS[1], 'round')
if round and round ~= ARGV[4] then
  return 0
end
if left > 0 and redis.call('HSETNX', KEYS[1], 'a:' .. ARGV[1], '1') == 1 then
  left = left - 1
end
if left <= 0 then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[3], ARGV[2], '*')
  return 0
end
return left
