-- Raise a fence counter to at least a token (MultiLock's second phase: the token drawn from a majority
-- is written back so that every later majority, which overlaps this one, draws a larger token).
-- KEYS[1] the fence counter; ARGV[1] the token. Returns the counter's value afterwards.
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  return token
end
return current
