-- Set a countdown latch's count, only if it is open (absent, or counted down to zero).
-- KEYS[1] the latch hash: field `count` the count it was set to, field `round` this arming's id,
-- and one field `a:<id>` per count_down that arrived (so a resent count_down counts once).
-- ARGV[1] the count, an integer >= 1 (checked by the caller); ARGV[2] the round's id, digits of a
-- random number below 2^53 (drawn by the caller), so that a count_down sent in an earlier round
-- and landing late counts for nothing (see latch_count_down.lua).
-- Returns 1 when set, 0 when the latch is still counting (nothing changed); a key of another type
-- is an error, untouched. Setting (not adding) makes a resend harmless: the second call finds the
-- latch counting and changes nothing.
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local left = latch_left(KEYS[1])
  if left and left > 0 then
    return 0
  end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'count', ARGV[1], 'round', ARGV[2])
return 1
