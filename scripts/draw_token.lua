-- Draw the fencing token of a hold that holds the lock now (prelude.lua's helpers before it): a
-- plain lock's acquisition draws none (acquire.lua, lazy), and its holder draws one when it first
-- asks for it.
-- KEYS[1] the lock hash, KEYS[2] its fence counter; ARGV[1] the hold's field (`owner:generation`),
-- ARGV[2] '1' on a master of a quorum (prelude.lua's draw_token, in_step), else '0'.
--
-- Drawn only while the hold's field is in the lock hash: every later hold of the lock starts after
-- this field is gone, and draws from the same counter, so its token is larger. A holder that draws
-- twice (a resend) gets a larger token the second time, which is as good: it is still below every
-- later holder's.
-- Returns the token (a number or its digits), or 0 when the hold is not there (lost): nothing is
-- written then. A lock or fence of another type fails before anything is written.
call = redis.call
if call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
return draw_token(KEYS[2], ARGV[2] == '1')
