-- Remove the lock whoever holds it (the fence counter stays).
-- KEYS[1] the lock hash; ARGV[1] the release channel; ARGV[2] the command that announces the release
-- (PUBLISH, or SPUBLISH on a cluster); ARGV[3] the message: '1' wakes one waiter per client, '*' all
-- (a fair lock's waiters, who are otherwise woken by name).
-- Returns 1 when a lock was removed, 0 when there was none; a key of another type is an error, untouched.
if ARGV[2] ~= 'PUBLISH' and ARGV[2] ~= 'SPUBLISH' then
  return redis.error_reply('ERR relock force_unlock: unknown publish command')
end
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[2], ARGV[1], ARGV[3] or '1')
return 1
