-- Record a handoff that the client has granted already (a function of the batch script, see
-- batch.lua): a release of a plain lock that another owner of the same client waits for gives the
-- waiter the lock at once, with the next fencing token after the releasing hold's, and this call
-- catches Redis up (see `handoff.rs`). Until it lands the waiter's lease is the releasing hold's:
-- the lock stays held in Redis throughout, by one hold or the other.
-- lock, fence: as acquire.lua; from: the releasing hold's field (it goes, whatever its count); to:
-- the receiving hold's field, a new hold (count 1); lease: its lease in ms; token: the token the
-- client gave it, as digits (the releasing hold's token plus one).
--
-- The fence is set to the token first, so that a later fresh acquisition draws above it. It must not
-- have been above it already (a token drawn meanwhile by another holder, after a loss of the lock that
-- the client had not yet seen): then nothing else is written and the handoff fails.
-- Set, not incremented: a resend finds `from` gone, `to` holding and the fence at the token, and
-- leaves that.
-- Returns released, granted: released 1 if `from`'s field was there and removed; granted 1 if `to`
-- holds the lock. A handoff that fails leaves the lock as it found it: the client then releases
-- `from` as usual (announcing it to any waiters).
-- A fence or lock of another type fails before anything is written (SET ... GET on another type
-- fails without writing; the lock hash is written only after).
local function transfer_granted(lock, fence, from, to, lease, token)
  -- Compared as digit strings, as acquire.lua does: a longer string of digits is the larger number.
  local counter = call('SET', fence, token, 'GET')
  if counter and (#counter > #token or (#counter == #token and counter >= token)) then
    -- Equal is a resend of this call only if `to` holds already.
    if counter ~= token or call('HEXISTS', lock, to) == 0 then
      if counter ~= token then
        call('SET', fence, counter)
      end
      return 0, 0
    end
  end
  -- With its mark, if there was one (2 fields removed): the mark goes to `to`, as its waiters still
  -- wait.
  local removed = call('HDEL', lock, from, from .. '~')
  if removed == 0 then
    -- Not held by `from` (lost), unless a resend finds `to` holding.
    return 0, call('HEXISTS', lock, to)
  end
  if removed == 2 then
    call('HSET', lock, to, '1', to .. '~', '1')
  else
    call('HSET', lock, to, '1')
  end
  call('PEXPIRE', lock, lease)
  return 1, 1
end
