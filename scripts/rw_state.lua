-- Read whether a read-write lock is held, for `Lock::is_locked` on either side: changes nothing.
-- KEYS[1] the write lock's hash; KEYS[2] the set of reader keys (see rw_read.lua).
-- Returns {1 if a writer holds it else 0, the number of live readers}. A reader key listed in the
-- set whose lease ran out (a crashed reader) is not counted. A key of another type is an error.
local writer = redis.call('EXISTS', KEYS[1])
local readers = 0
for _, reader in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  readers = readers + redis.call('EXISTS', reader)
end
return {writer, readers}
