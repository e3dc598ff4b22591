-- Remove a read-write lock whoever holds it: its writer, every reader and every waiting writer's
-- mark (the fence counter stays).
-- KEYS[1] the write lock's hash; KEYS[2] the set of reader keys; KEYS[3] the waiting writers' hash
-- (see rw_read.lua); ARGV[1] the release channel; ARGV[2] the command that announces the release
-- (PUBLISH, or SPUBLISH on a cluster).
-- Returns 1 when a writer or a live reader was removed, 0 when there was none. A key of another
-- type is an error, and nothing is removed.
if ARGV[2] ~= 'PUBLISH' and ARGV[2] ~= 'SPUBLISH' then
  return redis.error_reply('ERR relock rw_force_unlock: unknown publish command')
end
if not absent_or(KEYS[1], 'hash') or not absent_or(KEYS[2], 'set') or not absent_or(KEYS[3], 'hash') then
  return wrong_type()
end
local removed = redis.call('DEL', KEYS[1])
for _, reader in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  removed = removed + redis.call('DEL', reader)
end
redis.call('DEL', KEYS[2], KEYS[3])
if removed == 0 then
  return 0
end
-- Every waiter: writers wait on the channel, readers on the channel followed by `:r`.
redis.call(ARGV[2], ARGV[1], '*')
redis.call(ARGV[2], ARGV[1] .. ':r', '*')
return 1
